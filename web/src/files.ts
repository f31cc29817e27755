// The file browser: a files session (POST /v1/sandboxes/{id}/files/session)
// gives the data plane's base URL and a files-scoped token; lists, uploads
// and downloads go straight to the worker (CORS, Authorization: Bearer).
import { api, dataPlane } from './api';
import { bytes, clear, h } from './dom';

interface Session {
  url: string;
  token: string;
  expires: number;
}
interface Entry {
  path: string;
  name: string;
  type: string;
  size: number;
  mode: string;
  owner?: string;
  mod_time: string;
  target?: string;
}

function join(dir: string, name: string) {
  return dir.endsWith('/') ? dir + name : `${dir}/${name}`;
}
function parent(p: string) {
  if (p === '/' || !p.includes('/')) return '/';
  const i = p.replace(/\/+$/, '').lastIndexOf('/');
  return i <= 0 ? '/' : p.slice(0, i);
}

export function openFiles(sandboxId: string, mount: HTMLElement, start = '/home/user') {
  let sess: Session | null = null;
  let dir = start;
  const session = async () => {
    if (!sess || sess.expires - Date.now() < 60_000) {
      const s = await api('POST', `/v1/sandboxes/${encodeURIComponent(sandboxId)}/files/session`);
      sess = { url: s.url, token: s.token, expires: new Date(s.expires_at).getTime() };
    }
    return sess;
  };
  const msg = h('div', { class: 'msg', 'data-testid': 'files-msg' });
  const pathInput = h('input', { class: 'path', 'data-testid': 'files-path', value: dir, 'aria-label': 'directory' });
  const list = h('tbody');
  const fileInput = h('input', { type: 'file', multiple: true, 'data-testid': 'files-upload', 'aria-label': 'upload files' });

  const load = async (d: string) => {
    msg.textContent = '';
    try {
      const s = await session();
      const entries: Entry[] = [];
      let cursor = '';
      do {
        const r = await dataPlane(`${s.url}/list?path=${encodeURIComponent(d)}${cursor ? '&cursor=' + encodeURIComponent(cursor) : ''}`, s.token);
        const j = await r.json();
        entries.push(...(j.entries ?? []));
        cursor = j.next_cursor ?? '';
      } while (cursor && entries.length < 10_000);
      dir = d;
      pathInput.value = d;
      entries.sort((a, b) => (a.type === 'dir' ? 0 : 1) - (b.type === 'dir' ? 0 : 1) || a.name.localeCompare(b.name));
      clear(
        list,
        d !== '/' ? h('tr', null, h('td', null, h('a', { href: '#', onclick: (e: Event) => (e.preventDefault(), load(parent(d))) }, '..')), h('td'), h('td'), h('td'), h('td')) : null,
        entries.map((e) =>
          h(
            'tr',
            { 'data-file': e.name },
            h(
              'td',
              null,
              e.type === 'dir'
                ? h('a', { href: '#', class: 'dir', onclick: (ev: Event) => (ev.preventDefault(), load(join(d, e.name))) }, e.name + '/')
                : h('span', null, e.name, e.target ? ` → ${e.target}` : ''),
            ),
            h('td', { class: 'num' }, e.type === 'dir' ? '' : bytes(e.size)),
            h('td', { class: 'mono' }, e.mode, ' ', e.owner ?? ''),
            h('td', null, e.mod_time ? new Date(e.mod_time).toISOString().slice(0, 19).replace('T', ' ') : ''),
            h(
              'td',
              null,
              e.type === 'file' ? h('button', { class: 'small', 'data-testid': `download-${e.name}`, onclick: () => download(join(d, e.name), e.name) }, 'Download') : null,
              ' ',
              h('button', { class: 'small danger', onclick: () => remove(join(d, e.name), e.type === 'dir') }, 'Delete'),
            ),
          ),
        ),
      );
    } catch (e: any) {
      msg.textContent = e.message;
      msg.className = 'msg error';
    }
  };
  const download = async (p: string, name: string) => {
    try {
      const s = await session();
      const r = await dataPlane(`${s.url}/content?path=${encodeURIComponent(p)}`, s.token);
      const url = URL.createObjectURL(await r.blob());
      const a = h('a', { href: url, download: name });
      document.body.appendChild(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60_000);
    } catch (e: any) {
      msg.textContent = e.message;
      msg.className = 'msg error';
    }
  };
  const remove = async (p: string, recursive: boolean) => {
    if (!confirm(`Delete ${p}${recursive ? ' and everything in it' : ''}?`)) return;
    try {
      const s = await session();
      await dataPlane(`${s.url}?path=${encodeURIComponent(p)}${recursive ? '&recursive=1' : ''}`, s.token, { method: 'DELETE' });
      await load(dir);
    } catch (e: any) {
      msg.textContent = e.message;
      msg.className = 'msg error';
    }
  };
  fileInput.addEventListener('change', async () => {
    const files = Array.from(fileInput.files ?? []);
    try {
      const s = await session();
      for (const f of files) {
        msg.textContent = `uploading ${f.name}…`;
        msg.className = 'msg';
        await dataPlane(`${s.url}/content?path=${encodeURIComponent(join(dir, f.name))}`, s.token, { method: 'PUT', body: f });
      }
      fileInput.value = '';
      await load(dir);
      msg.textContent = `uploaded ${files.map((f) => f.name).join(', ')}`;
      msg.className = 'msg ok';
    } catch (e: any) {
      msg.textContent = e.message;
      msg.className = 'msg error';
    }
  });

  clear(
    mount,
    h(
      'form',
      { class: 'row', onsubmit: (e: Event) => (e.preventDefault(), load(pathInput.value || '/')) },
      pathInput,
      h('button', { type: 'submit' }, 'Open'),
      h('label', { class: 'upload button' }, 'Upload…', fileInput),
    ),
    msg,
    h('table', { class: 'grid files', 'data-testid': 'files' }, h('thead', null, h('tr', null, h('th', null, 'name'), h('th', null, 'size'), h('th', null, 'mode'), h('th', null, 'modified'), h('th'))), list),
  );
  load(dir);
}
