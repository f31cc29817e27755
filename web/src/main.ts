// Airlock's web console. Plain TypeScript over the DOM (src/dom.ts), hash
// routes, one /v1/events stream that keeps sandboxes and operations live.
import './nonce';
import './style.css';
import { api, apiKey, APIError, AirlockEvent, follow, setApiKey, whenUnauthorized } from './api';
import { ago, bytes, clear, h, stateBadge } from './dom';
import { openFiles } from './files';
import { openTerminal } from './terminal';

interface Sandbox {
  id: string;
  org_id: string;
  template: string;
  runtime: string;
  state: string;
  desired_state: string;
  reason?: string;
  worker_id?: string;
  metadata?: Record<string, string>;
  resources: { vcpus: number; memory_mib: number; disk_mib: number };
  created_at: string;
  updated_at: string;
  last_activity_at?: string;
  idle_suspend_after_s?: number;
  timeout_s?: number;
  checkpoints?: { name: string; bytes: number; created_at: string }[];
}
interface Operation {
  id: string;
  sandbox_id: string;
  kind: string;
  state: string;
  target: string;
  reason?: string;
  created_at: string;
  updated_at: string;
}

const app = document.getElementById('app')!;
const store = {
  sandboxes: new Map<string, Sandbox>(),
  ops: new Map<string, Operation>(),
  events: [] as AirlockEvent[],
  live: false,
  admin: false,
  operator: false,
  stop: null as null | (() => void),
};
let cleanup: (() => void) | null = null;
let refresh: (() => void) | null = null;
let pending = false;
function changed() {
  if (pending) return;
  pending = true;
  requestAnimationFrame(() => {
    pending = false;
    liveDot.dataset.live = String(store.live);
    liveDot.title = store.live ? 'live: following /v1/events' : 'reconnecting…';
    refresh?.();
  });
}

// ---- sign in ----

function signOut() {
  store.stop?.();
  store.stop = null;
  setApiKey(null);
  store.sandboxes.clear();
  store.ops.clear();
  store.events = [];
  location.hash = '';
  route();
}
whenUnauthorized(() => {
  if (apiKey()) {
    setApiKey(null);
    loginError = 'The key was refused (revoked, expired or mistyped); sign in again.';
    route();
  }
});
let loginError = '';

function loginPage() {
  const key = h('input', { type: 'password', name: 'key', autocomplete: 'off', placeholder: 'al_…', 'data-testid': 'login-key', 'aria-label': 'API key', required: true });
  const err = h('div', { class: 'msg error', 'data-testid': 'login-error' }, loginError);
  const form = h(
    'form',
    {
      class: 'login card',
      onsubmit: async (e: Event) => {
        e.preventDefault();
        setApiKey(key.value.trim());
        try {
          await start();
          loginError = '';
          if (!location.hash || location.hash === '#/') location.hash = '#/sandboxes';
          route();
        } catch (x: any) {
          setApiKey(null);
          err.textContent = x instanceof APIError ? x.message : String(x);
        }
      },
    },
    h('h1', null, 'Airlock'),
    h('p', null, 'Sign in with an API key. ', h('code', null, 'airlock up'), ' writes the admin key to ', h('code', null, '<data-dir>/admin.key'), '. The key stays in this tab (sessionStorage) and goes only to this server.'),
    key,
    h('button', { type: 'submit', 'data-testid': 'login-submit' }, 'Sign in'),
    err,
  );
  clear(app, form);
  key.focus();
}

async function start() {
  const sbs = await api<{ sandboxes: Sandbox[] }>('GET', '/v1/sandboxes?limit=1000');
  store.sandboxes.clear();
  for (const s of sbs.sandboxes) store.sandboxes.set(s.id, s);
  try {
    const orgs = await api<{ orgs: { id: string }[] }>('GET', '/v1/orgs');
    store.admin = true;
    store.operator = orgs.orgs.length > 1 || orgs.orgs.some((o) => o.id === 'org-default');
  } catch {
    store.admin = false;
    store.operator = false;
  }
  store.stop?.();
  store.stop = follow('/v1/events', onEvent, (live) => {
    store.live = live;
    changed();
  });
}

function onEvent(ev: AirlockEvent) {
  store.events.push(ev);
  if (store.events.length > 5000) store.events.splice(0, store.events.length - 5000);
  if (ev.type === 'sandbox.state' && ev.data?.id) {
    const prev = store.sandboxes.get(ev.data.id);
    if (!prev || (ev.data.generation ?? 0) >= ((prev as any).generation ?? 0)) store.sandboxes.set(ev.data.id, ev.data);
  } else if (ev.type === 'operation.state' && ev.data?.id) {
    store.ops.set(ev.data.id, ev.data);
  }
  changed();
}

// ---- shell ----

const liveDot = h('span', { class: 'live', 'data-testid': 'live' });
function shell(active: string, ...content: (Node | string | null)[]) {
  const link = (href: string, label: string, id: string) => h('a', { href, class: active === id ? 'active' : '', 'data-nav': id }, label);
  clear(
    app,
    h(
      'header',
      null,
      h('a', { class: 'brand', href: '#/sandboxes' }, 'Airlock'),
      h(
        'nav',
        null,
        link('#/sandboxes', 'Sandboxes', 'sandboxes'),
        link('#/operations', 'Operations', 'operations'),
        link('#/templates', 'Templates', 'templates'),
        store.admin ? link('#/admin', 'Admin', 'admin') : null,
      ),
      h('span', { class: 'spacer' }),
      liveDot,
      h('button', { class: 'link', onclick: signOut, 'data-testid': 'sign-out' }, 'Sign out'),
    ),
    h('main', null, ...content),
  );
}

function errorBox(e: unknown) {
  return h('div', { class: 'msg error' }, e instanceof Error ? e.message : String(e));
}

function resources(r?: Sandbox['resources']) {
  if (!r) return '';
  return `${r.vcpus} vCPU · ${r.memory_mib} MiB · ${(r.disk_mib / 1024).toFixed(r.disk_mib % 1024 ? 1 : 0)} GiB disk`;
}
function metadata(m?: Record<string, string>) {
  return h('span', { class: 'chips' }, Object.entries(m ?? {}).map(([k, v]) => h('span', { class: 'chip' }, `${k}=${v}`)));
}

// ---- sandboxes ----

function sandboxesPage() {
  const showDeleted = h('input', { type: 'checkbox', 'aria-label': 'show deleted' });
  const body = h('tbody');
  const msg = h('div', { class: 'msg' });
  const tpl = h('select', { name: 'template', 'data-testid': 'create-template' });
  api<{ templates: { name: string; tag: string }[] }>('GET', '/v1/templates')
    .then((t) => {
      const names = [...new Set(t.templates.map((x) => (x.tag && x.tag !== 'latest' ? `${x.name}:${x.tag}` : x.name)).filter(Boolean))];
      if (!names.includes('base')) names.unshift('base');
      clear(tpl, names.map((n) => h('option', { value: n, selected: n === 'base' }, n)));
    })
    .catch(() => clear(tpl, h('option', { value: 'base' }, 'base')));
  const vcpus = h('input', { type: 'number', min: 1, max: 8, value: 1, name: 'vcpus', 'aria-label': 'vCPUs' });
  const mem = h('input', { type: 'number', min: 128, max: 16384, step: 128, value: 512, name: 'memory', 'aria-label': 'memory MiB' });
  const meta = h('input', { name: 'metadata', placeholder: 'team=a, purpose=demo', 'data-testid': 'create-metadata', 'aria-label': 'metadata' });
  const form = h(
    'form',
    {
      class: 'row card',
      onsubmit: async (e: Event) => {
        e.preventDefault();
        const md: Record<string, string> = {};
        for (const part of meta.value.split(',')) {
          const [k, ...v] = part.split('=');
          if (k.trim()) md[k.trim()] = v.join('=').trim();
        }
        msg.className = 'msg';
        msg.textContent = 'creating…';
        try {
          const r = await api('POST', '/v1/sandboxes', {
            template: tpl.value,
            resources: { vcpus: Number(vcpus.value), memory_mib: Number(mem.value) },
            metadata: Object.keys(md).length ? md : undefined,
          });
          store.sandboxes.set(r.sandbox.id, r.sandbox);
          store.ops.set(r.operation.id, r.operation);
          msg.className = 'msg ok';
          msg.textContent = `created ${r.sandbox.id} (operation ${r.operation.id})`;
          meta.value = '';
          draw();
        } catch (x) {
          msg.className = 'msg error';
          msg.textContent = (x as Error).message;
        }
      },
    },
    h('strong', null, 'New sandbox'),
    h('label', null, 'template ', tpl),
    h('label', null, 'vCPUs ', vcpus),
    h('label', null, 'MiB ', mem),
    h('label', null, 'metadata ', meta),
    h('button', { type: 'submit', 'data-testid': 'create-sandbox' }, 'Create'),
  );
  const draw = () => {
    const list = [...store.sandboxes.values()].filter((s) => showDeleted.checked || s.state !== 'deleted').sort((a, b) => b.created_at.localeCompare(a.created_at));
    clear(
      body,
      list.length
        ? list.map((s) =>
            h(
              'tr',
              { 'data-sandbox': s.id },
              h('td', { class: 'mono' }, h('a', { href: `#/sandboxes/${s.id}` }, s.id)),
              h('td', null, stateBadge(s.state), s.desired_state && s.desired_state !== s.state && !(s.desired_state === 'running' && s.state === 'running') ? h('span', { class: 'dim' }, ` → ${s.desired_state}`) : null),
              h('td', null, s.template),
              h('td', null, s.runtime),
              h('td', null, resources(s.resources)),
              h('td', null, metadata(s.metadata)),
              h('td', { title: s.created_at }, ago(s.created_at)),
            ),
          )
        : h('tr', null, h('td', { colspan: 7, class: 'dim' }, 'No sandboxes yet: create one above, or with `airlock sandbox create`.')),
    );
  };
  showDeleted.addEventListener('change', draw);
  shell(
    'sandboxes',
    h('div', { class: 'title' }, h('h2', null, 'Sandboxes'), h('label', { class: 'dim' }, showDeleted, ' show deleted')),
    form,
    msg,
    h(
      'table',
      { class: 'grid', 'data-testid': 'sandboxes' },
      h('thead', null, h('tr', null, ...['id', 'state', 'template', 'runtime', 'resources', 'metadata', 'created'].map((c) => h('th', null, c)))),
      body,
    ),
  );
  draw();
  refresh = draw;
}

const lifecycle: Record<string, string[]> = {
  pause: ['running'],
  resume: ['paused'],
  suspend: ['running', 'paused'],
  wake: ['suspended', 'paused'],
};

function sandboxPage(id: string, tab: string) {
  const head = h('div', { class: 'card', 'data-testid': 'sandbox-head' });
  const msg = h('div', { class: 'msg' });
  const pane = h('div', { class: 'pane' });
  const act = async (what: string) => {
    msg.className = 'msg';
    msg.textContent = `${what}…`;
    try {
      const r = what === 'delete' ? await api('DELETE', `/v1/sandboxes/${id}`) : await api('POST', `/v1/sandboxes/${id}/${what}`, {});
      store.ops.set(r.operation.id, r.operation);
      msg.className = 'msg ok';
      msg.textContent = `${r.operation.kind} operation ${r.operation.id}: ${r.operation.state}`;
    } catch (x) {
      msg.className = 'msg error';
      msg.textContent = (x as Error).message;
    }
  };
  const drawHead = () => {
    const s = store.sandboxes.get(id);
    if (!s) {
      clear(head, h('p', { class: 'dim' }, 'loading…'));
      return;
    }
    const kv = (k: string, v: Node | string | number | undefined) => [h('dt', null, k), h('dd', null, v ?? '')];
    clear(
      head,
      h('div', { class: 'title' }, h('h2', { class: 'mono' }, s.id), stateBadge(s.state)),
      s.reason ? h('div', { class: 'msg error' }, s.reason) : null,
      h(
        'dl',
        { class: 'kv' },
        kv('desired', s.desired_state),
        kv('template', s.template),
        kv('runtime', s.runtime),
        kv('worker', s.worker_id),
        kv('resources', resources(s.resources)),
        kv('metadata', metadata(s.metadata)),
        kv('created', `${ago(s.created_at)} (${s.created_at})`),
        kv('last activity', ago(s.last_activity_at)),
        kv('idle suspend', s.idle_suspend_after_s ? `after ${s.idle_suspend_after_s} s` : 'never'),
        kv('checkpoints', (s.checkpoints ?? []).map((c) => c.name).join(', ') || 'none'),
      ),
      h(
        'div',
        { class: 'row' },
        Object.entries(lifecycle).map(([k, from]) => h('button', { disabled: !from.includes(s.state), onclick: () => act(k), 'data-action': k }, k)),
        h('button', { class: 'danger', disabled: s.state === 'deleted' || s.state === 'deleting', 'data-action': 'delete', onclick: () => confirm(`Delete ${s.id}?`) && act('delete') }, 'delete'),
      ),
    );
  };
  const tabs = ['terminal', 'files', 'events'];
  const drawEvents = () => {
    const evs = store.events.filter((e) => e.sandbox_id === id).slice(-500).reverse();
    clear(
      pane,
      h(
        'table',
        { class: 'grid', 'data-testid': 'sandbox-events' },
        h('thead', null, h('tr', null, h('th', null, 'seq'), h('th', null, 'time'), h('th', null, 'type'), h('th', null, 'what'))),
        h(
          'tbody',
          null,
          evs.map((e) =>
            h(
              'tr',
              null,
              h('td', { class: 'num' }, e.seq),
              h('td', null, new Date(e.time).toISOString().slice(11, 19)),
              h('td', null, e.type),
              h(
                'td',
                null,
                e.type === 'sandbox.state'
                  ? [stateBadge(e.data.state), e.data.reason ? ` ${e.data.reason}` : '']
                  : e.type === 'operation.state'
                    ? [`${e.data.kind} `, stateBadge(e.data.state), ` ${e.data.id}`, e.data.reason ? ` — ${e.data.reason}` : '']
                    : e.type === 'network.denied'
                      ? `denied ${e.data.kind} ${e.data.name ?? e.data.ip ?? ''}: ${e.data.reason}`
                      : JSON.stringify(e.data).slice(0, 200),
              ),
            ),
          ),
        ),
      ),
    );
  };
  shell(
    'sandboxes',
    h('p', null, h('a', { href: '#/sandboxes' }, '← sandboxes')),
    head,
    msg,
    h(
      'div',
      { class: 'tabs' },
      tabs.map((t) => h('a', { href: `#/sandboxes/${id}/${t}`, class: t === tab ? 'active' : '', 'data-tab': t }, t)),
    ),
    pane,
  );
  drawHead();
  api<Sandbox>('GET', `/v1/sandboxes/${id}`)
    .then((s) => {
      const prev = store.sandboxes.get(id) as any;
      if (!prev || ((s as any).generation ?? 0) >= (prev.generation ?? 0)) store.sandboxes.set(id, s);
      drawHead();
    })
    .catch((e) => clear(head, errorBox(e)));
  const s = store.sandboxes.get(id);
  if (tab === 'terminal') {
    if (s && s.state !== 'running' && s.state !== 'paused' && s.state !== 'suspended') {
      clear(pane, h('p', { class: 'dim' }, `The sandbox is ${s.state}; the terminal opens once it runs.`));
      let opened = false;
      refresh = () => {
        drawHead();
        const n = store.sandboxes.get(id);
        if (!opened && n?.state === 'running') {
          opened = true;
          cleanup = openTerminal(id, pane);
        }
      };
      return;
    }
    cleanup = openTerminal(id, pane);
    refresh = drawHead;
  } else if (tab === 'files') {
    openFiles(id, pane);
    refresh = drawHead;
  } else {
    drawEvents();
    refresh = () => {
      drawHead();
      drawEvents();
    };
  }
}

// ---- operations ----

function operationsPage() {
  const body = h('tbody');
  const draw = () => {
    const ops = [...store.ops.values()].sort((a, b) => b.created_at.localeCompare(a.created_at));
    clear(
      body,
      ops.length
        ? ops.map((o) =>
            h(
              'tr',
              { 'data-op': o.id },
              h('td', { class: 'mono' }, o.id),
              h('td', null, o.kind),
              h('td', null, stateBadge(o.state)),
              h('td', null, o.target),
              h('td', { class: 'mono' }, h('a', { href: `#/sandboxes/${o.sandbox_id}` }, o.sandbox_id)),
              h('td', { title: o.created_at }, ago(o.created_at)),
              h('td', null, o.state === 'pending' || o.state === 'running' ? '' : `${((new Date(o.updated_at).getTime() - new Date(o.created_at).getTime()) / 1000).toFixed(1)} s`),
              h('td', { class: 'reason' }, o.reason ?? ''),
            ),
          )
        : h('tr', null, h('td', { colspan: 8, class: 'dim' }, 'No operations in the event log yet.')),
    );
  };
  shell(
    'operations',
    h('div', { class: 'title' }, h('h2', null, 'Operations')),
    h('p', { class: 'dim' }, 'Every create, delete and lifecycle operation of the org, from its event stream, live.'),
    h(
      'table',
      { class: 'grid', 'data-testid': 'operations' },
      h('thead', null, h('tr', null, ...['id', 'kind', 'state', 'target', 'sandbox', 'created', 'took', 'reason'].map((c) => h('th', null, c)))),
      body,
    ),
  );
  draw();
  refresh = draw;
}

// ---- templates and builds ----

function parseSteps(text: string) {
  const steps: { kind: string; args: string[]; text: string }[] = [];
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (!line || line.startsWith('#')) continue;
    const m = /^(\w+)\s+(.*)$/.exec(line);
    if (!m) throw new Error(`cannot read "${line}": KIND ARGS, e.g. RUN echo hi`);
    const kind = m[1].toUpperCase();
    const rest = m[2];
    if (kind === 'RUN' || kind === 'WORKDIR' || kind === 'USER') steps.push({ kind, args: [rest], text: line });
    else if (kind === 'ENV') {
      const eq = /^([^=\s]+)=(.*)$/.exec(rest);
      const sp = /^(\S+)\s+(.*)$/.exec(rest);
      const kv = eq ?? sp;
      if (!kv) throw new Error(`ENV needs a name and a value: "${line}"`);
      steps.push({ kind, args: [kv[1], kv[2]], text: line });
    } else throw new Error(`${kind}: the console builds RUN, ENV, WORKDIR and USER steps; use \`airlock template build\` for COPY, CMD and the rest of a Dockerfile`);
  }
  return steps;
}

function templatesPage() {
  const tbody = h('tbody');
  const bbody = h('tbody');
  const msg = h('div', { class: 'msg' });
  const name = h('input', { name: 'name', placeholder: 'name', required: true, 'data-testid': 'build-name', 'aria-label': 'template name' });
  const tag = h('input', { name: 'tag', placeholder: 'latest', 'aria-label': 'tag' });
  const from = h('input', { name: 'from', value: 'base', 'aria-label': 'from' });
  const steps = h('textarea', { name: 'steps', rows: 4, 'data-testid': 'build-steps', 'aria-label': 'steps', placeholder: 'RUN pip install requests\nENV PORT 8000\nWORKDIR /app' });
  const load = async () => {
    try {
      const [t, b] = await Promise.all([api('GET', '/v1/templates'), api('GET', '/v1/templates/builds?limit=100')]);
      clear(
        tbody,
        t.templates.map((x: any) =>
          h('tr', { 'data-template': `${x.name}:${x.tag}` }, h('td', null, x.name || h('span', { class: 'dim' }, '(untagged)')), h('td', null, x.tag), h('td', { class: 'mono', title: x.digest }, (x.digest ?? '').slice(0, 19) + '…'), h('td', { class: 'num' }, bytes(x.size_bytes)), h('td', null, ago(x.created_at))),
        ),
      );
      clear(
        bbody,
        b.builds.length
          ? b.builds.map((x: any) =>
              h(
                'tr',
                { 'data-build': x.id },
                h('td', { class: 'mono' }, h('a', { href: `#/templates/builds/${x.id}` }, x.id)),
                h('td', null, `${x.spec?.name}:${x.spec?.tag || 'latest'}`),
                h('td', null, stateBadge(x.state)),
                h('td', null, `${(x.steps ?? []).filter((s: any) => s.index >= 0).length} / ${(x.spec?.steps ?? []).length}`),
                h('td', null, ago(x.created_at)),
                h('td', { class: 'reason' }, x.error ?? ''),
              ),
            )
          : h('tr', null, h('td', { colspan: 6, class: 'dim' }, 'No builds yet.')),
      );
    } catch (e) {
      clear(tbody, h('tr', null, h('td', { colspan: 5 }, errorBox(e))));
    }
  };
  const form = h(
    'form',
    {
      class: 'card build-form',
      onsubmit: async (e: Event) => {
        e.preventDefault();
        try {
          const b = await api('POST', '/v1/templates/builds', { name: name.value.trim(), tag: tag.value.trim() || undefined, from: from.value.trim() || 'base', steps: parseSteps(steps.value) });
          location.hash = `#/templates/builds/${b.id}`;
        } catch (x) {
          msg.className = 'msg error';
          msg.textContent = (x as Error).message;
        }
      },
    },
    h('strong', null, 'New build'),
    h('div', { class: 'row' }, h('label', null, 'name ', name), h('label', null, 'tag ', tag), h('label', null, 'from ', from)),
    steps,
    h('div', { class: 'row' }, h('button', { type: 'submit', 'data-testid': 'build-start' }, 'Build'), h('span', { class: 'dim' }, 'RUN, ENV, WORKDIR, USER; one step a line.')),
  );
  shell(
    'templates',
    h('div', { class: 'title' }, h('h2', null, 'Templates')),
    h('table', { class: 'grid', 'data-testid': 'templates' }, h('thead', null, h('tr', null, ...['name', 'tag', 'digest', 'size', 'created'].map((c) => h('th', null, c)))), tbody),
    h('div', { class: 'title' }, h('h2', null, 'Builds')),
    form,
    msg,
    h('table', { class: 'grid', 'data-testid': 'builds' }, h('thead', null, h('tr', null, ...['id', 'template', 'state', 'steps', 'started', 'error'].map((c) => h('th', null, c)))), bbody),
  );
  load();
  const t = setInterval(load, 5000);
  cleanup = () => clearInterval(t);
}

function buildPage(id: string) {
  const head = h('div', { class: 'card', 'data-testid': 'build-head' });
  const bar = h('progress', { max: 1, value: 0, 'data-testid': 'build-progress' });
  const log = h('pre', { class: 'log', 'data-testid': 'build-log' });
  const ctl = new AbortController();
  cleanup = () => ctl.abort();
  shell('templates', h('p', null, h('a', { href: '#/templates' }, '← templates')), head, bar, log);
  let total = 0;
  const drawHead = (b: any) => {
    total = (b.spec?.steps ?? []).length;
    clear(
      head,
      h('div', { class: 'title' }, h('h2', { class: 'mono' }, b.id), stateBadge(b.state)),
      h(
        'dl',
        { class: 'kv' },
        h('dt', null, 'template'),
        h('dd', null, `${b.spec?.name}:${b.spec?.tag || 'latest'}`),
        h('dt', null, 'from'),
        h('dd', null, b.spec?.from ?? ''),
        h('dt', null, 'worker'),
        h('dd', null, b.worker ?? ''),
        h('dt', null, 'digest'),
        h('dd', { class: 'mono' }, b.digest ?? ''),
        b.error ? [h('dt', null, 'error'), h('dd', { class: 'reason' }, b.error)] : null,
      ),
    );
  };
  (async () => {
    try {
      drawHead(await api('GET', `/v1/templates/builds/${id}`, undefined, ctl.signal));
      let after = 0;
      let done = 0;
      for (;;) {
        const r = await api('GET', `/v1/templates/builds/${id}/events?after=${after}&wait=30s`, undefined, ctl.signal);
        for (const ev of r.events) {
          after = Math.max(after, ev.seq);
          let line = '';
          if (ev.type === 'step') line = `==> ${ev.step?.text ?? ''}${ev.step?.cached ? ' (cached)' : ''}`;
          else if (ev.type === 'step_done') line = `    done in ${((ev.step?.duration_ms ?? 0) / 1000).toFixed(1)} s`;
          else if (ev.type === 'output') line = ev.text;
          else if (ev.type === 'done') line = `==> done: ${ev.digest}`;
          else if (ev.type === 'error') line = `!!! ${ev.text}`;
          else line = `--- ${ev.text ?? ev.type}`;
          if ((ev.type === 'step' && ev.step?.cached) || ev.type === 'step_done') done++;
          log.append(line + '\n');
          if (total) bar.value = Math.min(1, done / total);
        }
        if (r.state !== 'building' && !r.events.length) {
          const b = await api('GET', `/v1/templates/builds/${id}`, undefined, ctl.signal);
          drawHead(b);
          if (b.state === 'ready') bar.value = 1;
          break;
        }
        if (r.state !== 'building') drawHead(await api('GET', `/v1/templates/builds/${id}`, undefined, ctl.signal));
      }
    } catch (e) {
      if (!ctl.signal.aborted) head.append(errorBox(e));
    }
  })();
}

// ---- admin: orgs, keys, quotas, network profiles ----

const quotaNames = ['sandboxes', 'vcpus', 'memory_mib', 'disk_mib', 'checkpoints', 'transfers'];

function adminPage(selected?: string) {
  const orgsBody = h('tbody');
  const detail = h('div', { 'data-testid': 'org-detail' });
  const profiles = h('tbody');
  const msg = h('div', { class: 'msg' });
  const secret = h('div', { 'data-testid': 'key-secret' }); // kept across reloads of the org
  const say = (ok: boolean, text: string) => {
    msg.className = ok ? 'msg ok' : 'msg error';
    msg.textContent = text;
  };
  const loadOrgs = async () => {
    try {
      const r = await api('GET', '/v1/orgs');
      const full = await Promise.all(r.orgs.map((o: any) => api('GET', `/v1/orgs/${o.id}`).catch(() => o)));
      clear(
        orgsBody,
        full.map((o: any) =>
          h(
            'tr',
            { 'data-org': o.id, class: o.id === selected ? 'selected' : '' },
            h('td', { class: 'mono' }, h('a', { href: `#/admin/${o.id}` }, o.id)),
            h('td', null, o.name),
            h('td', null, (o.features ?? []).join(', ')),
            h('td', null, quotaNames.map((q) => h('span', { class: 'chip' }, `${q} ${o.usage?.[q] ?? 0}/${o.quotas?.[q] ? o.quotas[q] : '∞'}`))),
          ),
        ),
      );
      if (!selected && full.length) selected = full[0].id;
      const org = full.find((o: any) => o.id === selected);
      if (org) await loadOrg(org);
    } catch (e) {
      clear(orgsBody, h('tr', null, h('td', { colspan: 4 }, errorBox(e))));
    }
  };
  let shownOrg = '';
  const loadOrg = async (org: any) => {
    if (org.id !== shownOrg) secret.replaceChildren(); // a secret shows only with its org
    shownOrg = org.id;
    const keys = await api('GET', `/v1/orgs/${org.id}/keys`).catch((e) => ({ error: e }));
    const keyName = h('input', { placeholder: 'key name', required: true, 'data-testid': 'key-name', 'aria-label': 'key name' });
    const keyAdmin = h('input', { type: 'checkbox', 'aria-label': 'admin' });
    const qInputs = Object.fromEntries(quotaNames.map((q) => [q, h('input', { type: 'number', min: 0, value: org.quotas?.[q] ?? 0, name: q, 'data-quota': q, 'aria-label': q })]));
    clear(
      detail,
      h('div', { class: 'title' }, h('h3', null, `Org ${org.name} `, h('span', { class: 'mono dim' }, org.id))),
      h(
        'form',
        {
          class: 'row card',
          onsubmit: async (e: Event) => {
            e.preventDefault();
            const quotas: Record<string, number> = {};
            for (const q of quotaNames) quotas[q] = Number((qInputs[q] as HTMLInputElement).value || 0);
            try {
              await api('PATCH', `/v1/orgs/${org.id}`, { quotas });
              say(true, `quotas of ${org.id} saved`);
              loadOrgs();
            } catch (x) {
              say(false, (x as Error).message);
            }
          },
        },
        h('strong', null, 'Quotas (0 = unlimited)'),
        quotaNames.map((q) => h('label', null, `${q} `, qInputs[q])),
        h('button', { type: 'submit', 'data-testid': 'save-quotas', disabled: !store.operator }, 'Save'),
      ),
      h(
        'form',
        {
          class: 'row card',
          onsubmit: async (e: Event) => {
            e.preventDefault();
            try {
              const r = await api('POST', `/v1/orgs/${org.id}/keys`, { name: keyName.value.trim(), admin: keyAdmin.checked });
              clear(secret, h('div', { class: 'msg ok' }, 'New key (shown once; copy it now): ', h('code', { 'data-testid': 'new-secret' }, r.secret)));
              keyName.value = '';
              loadOrg(org);
            } catch (x) {
              say(false, (x as Error).message);
            }
          },
        },
        h('strong', null, 'New key'),
        keyName,
        h('label', null, keyAdmin, ' admin'),
        h('button', { type: 'submit', 'data-testid': 'create-key' }, 'Create key'),
      ),
      secret,
      'error' in keys
        ? errorBox(keys.error)
        : h(
            'table',
            { class: 'grid', 'data-testid': 'keys' },
            h('thead', null, h('tr', null, ...['id', 'name', 'prefix', 'admin', 'created', 'status', ''].map((c) => h('th', null, c)))),
            h(
              'tbody',
              null,
              keys.keys.map((k: any) =>
                h(
                  'tr',
                  { 'data-key': k.name },
                  h('td', { class: 'mono' }, k.id),
                  h('td', null, k.name),
                  h('td', { class: 'mono' }, k.prefix + '…'),
                  h('td', null, k.admin ? 'admin' : ''),
                  h('td', null, ago(k.created_at)),
                  h('td', null, k.revoked_at ? stateBadge('revoked') : k.expires_at && new Date(k.expires_at) < new Date() ? stateBadge('expired') : stateBadge('active')),
                  h(
                    'td',
                    null,
                    k.revoked_at
                      ? null
                      : h(
                          'button',
                          {
                            class: 'small danger',
                            onclick: async () => {
                              if (!confirm(`Revoke ${k.name} (${k.prefix}…)?`)) return;
                              try {
                                await api('DELETE', `/v1/orgs/${org.id}/keys/${k.id}`);
                                loadOrg(org);
                              } catch (x) {
                                say(false, (x as Error).message);
                              }
                            },
                          },
                          'Revoke',
                        ),
                  ),
                ),
              ),
            ),
          ),
    );
  };
  const loadProfiles = async () => {
    try {
      const r = await api('GET', '/v1/network-profiles');
      clear(
        profiles,
        r.profiles.map((p: any) =>
          h(
            'tr',
            { 'data-profile': p.name },
            h('td', null, p.name),
            h('td', null, p.builtin ? 'built in' : ''),
            h('td', null, p.description ?? ''),
            h('td', null, h('code', { class: 'policy' }, JSON.stringify(p.policy ?? {}).slice(0, 160))),
            h(
              'td',
              null,
              p.builtin || !store.operator
                ? null
                : h(
                    'button',
                    {
                      class: 'small danger',
                      onclick: async () => {
                        if (!confirm(`Delete network profile ${p.name}?`)) return;
                        try {
                          await api('DELETE', `/v1/network-profiles/${encodeURIComponent(p.name)}`);
                          loadProfiles();
                        } catch (x) {
                          say(false, (x as Error).message);
                        }
                      },
                    },
                    'Delete',
                  ),
            ),
          ),
        ),
      );
    } catch (e) {
      clear(profiles, h('tr', null, h('td', { colspan: 5 }, errorBox(e))));
    }
  };
  const orgName = h('input', { placeholder: 'org name', required: true, 'data-testid': 'org-name', 'aria-label': 'org name' });
  const pName = h('input', { placeholder: 'profile name', required: true, 'data-testid': 'profile-name', 'aria-label': 'profile name' });
  const pDesc = h('input', { placeholder: 'description', 'aria-label': 'description' });
  const pPolicy = h('textarea', { rows: 3, 'data-testid': 'profile-policy', 'aria-label': 'policy JSON' });
  pPolicy.value = '{"version": 1, "default": "deny", "rules": [{"action": "allow", "domains": ["pypi.org", "*.pythonhosted.org"], "ports": [443]}]}';
  shell(
    'admin',
    h('div', { class: 'title' }, h('h2', null, 'Orgs')),
    store.operator
      ? h(
          'form',
          {
            class: 'row card',
            onsubmit: async (e: Event) => {
              e.preventDefault();
              try {
                const o = await api('POST', '/v1/orgs', { name: orgName.value.trim() });
                say(true, `created org ${o.id}`);
                orgName.value = '';
                location.hash = `#/admin/${o.id}`;
              } catch (x) {
                say(false, (x as Error).message);
              }
            },
          },
          h('strong', null, 'New org'),
          orgName,
          h('button', { type: 'submit', 'data-testid': 'create-org' }, 'Create org'),
        )
      : null,
    msg,
    h('table', { class: 'grid', 'data-testid': 'orgs' }, h('thead', null, h('tr', null, ...['id', 'name', 'features', 'usage / quota'].map((c) => h('th', null, c)))), orgsBody),
    detail,
    h('div', { class: 'title' }, h('h2', null, 'Network profiles')),
    store.operator
      ? h(
          'form',
          {
            class: 'card build-form',
            onsubmit: async (e: Event) => {
              e.preventDefault();
              try {
                const policy = JSON.parse(pPolicy.value);
                await api('PUT', `/v1/network-profiles/${encodeURIComponent(pName.value.trim())}`, { description: pDesc.value, policy });
                say(true, `saved network profile ${pName.value.trim()}`);
                loadProfiles();
              } catch (x) {
                say(false, (x as Error).message);
              }
            },
          },
          h('div', { class: 'row' }, h('strong', null, 'Create or replace a profile'), pName, pDesc),
          pPolicy,
          h('div', { class: 'row' }, h('button', { type: 'submit', 'data-testid': 'save-profile' }, 'Save profile'), h('span', { class: 'dim' }, 'NetworkPolicyV1 (docs/network.md)')),
        )
      : null,
    h('table', { class: 'grid', 'data-testid': 'profiles' }, h('thead', null, h('tr', null, ...['name', '', 'description', 'policy', ''].map((c) => h('th', null, c)))), profiles),
  );
  loadOrgs();
  loadProfiles();
}

// ---- router ----

function route() {
  cleanup?.();
  cleanup = null;
  refresh = null;
  if (!apiKey()) {
    loginPage();
    return;
  }
  const parts = location.hash.replace(/^#\/?/, '').split('/').filter(Boolean).map(decodeURIComponent);
  switch (parts[0]) {
    case 'sandboxes':
      if (parts[1]) sandboxPage(parts[1], parts[2] ?? 'terminal');
      else sandboxesPage();
      break;
    case 'operations':
      operationsPage();
      break;
    case 'templates':
      if (parts[1] === 'builds' && parts[2]) buildPage(parts[2]);
      else templatesPage();
      break;
    case 'admin':
      if (store.admin) adminPage(parts[1]);
      else shell('admin', errorBox('This key is not an admin key of its org: orgs, keys and quotas need one.'));
      break;
    default:
      sandboxesPage();
  }
}

window.addEventListener('hashchange', route);
(async () => {
  if (apiKey()) {
    try {
      await start();
    } catch (e) {
      setApiKey(null);
      loginError = (e as Error).message;
    }
  }
  route();
})();
