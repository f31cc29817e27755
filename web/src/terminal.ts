// A live terminal into a sandbox: a `pty` command session (bash -l) whose
// attach WebSocket goes straight to the sandbox's worker (the data plane).
// Frames are one binary message each: first byte the kind (see
// docs/api.md, "The attach WebSocket"). A browser cannot set Authorization
// on a WebSocket, so the token travels as the subprotocol
// "airlock.token.<token>" next to "airlock.v1", which the worker selects.
import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import '@xterm/xterm/css/xterm.css';
import { api } from './api';
import { h } from './dom';

const F = { stdout: 1, stderr: 2, exit: 3, started: 4, error: 5, stdin: 16, signal: 18, resize: 19 } as const;
const enc = new TextEncoder();

function frame(kind: number, payload: Uint8Array | string = new Uint8Array()) {
  const p = typeof payload === 'string' ? enc.encode(payload) : payload;
  const b = new Uint8Array(p.length + 1);
  b[0] = kind;
  b.set(p, 1);
  return b;
}

export function openTerminal(sandboxId: string, mount: HTMLElement): () => void {
  const status = h('span', { class: 'term-status', 'data-testid': 'term-status' }, 'connecting…');
  const box = h('div', { class: 'term', 'data-testid': 'terminal' });
  mount.replaceChildren(h('div', { class: 'term-bar' }, status), box);
  const term = new Terminal({ cursorBlink: true, fontSize: 14, fontFamily: 'DejaVu Sans Mono, Menlo, monospace', scrollback: 5000, theme: { background: '#0d1117' } });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(box);
  fit.fit();
  let ws: WebSocket | null = null;
  let closed = false;
  let offset = 0;
  let url = '';
  let token = '';
  const dec = new TextDecoder();
  const send = (b: Uint8Array) => {
    if (ws?.readyState === WebSocket.OPEN) ws.send(b);
  };
  const sendResize = () => send(frame(F.resize, JSON.stringify({ cols: term.cols, rows: term.rows })));

  const attach = () => {
    const u = offset ? `${url}${url.includes('?') ? '&' : '?'}offset=${offset}` : url;
    ws = new WebSocket(u, ['airlock.v1', `airlock.token.${token}`]);
    ws.binaryType = 'arraybuffer';
    ws.onopen = () => {
      status.textContent = 'connected';
      status.dataset.state = 'connected';
      sendResize();
      term.focus();
    };
    ws.onmessage = (m) => {
      if (!(m.data instanceof ArrayBuffer)) return;
      const b = new Uint8Array(m.data);
      if (!b.length) return;
      const p = b.subarray(1);
      switch (b[0]) {
        case F.stdout:
        case F.stderr:
          offset += p.length;
          term.write(p);
          break;
        case F.exit: {
          const x = JSON.parse(dec.decode(p));
          status.textContent = `exited (${x.signal ? 'signal ' + x.signal : 'code ' + x.exit_code})`;
          status.dataset.state = 'exited';
          closed = true;
          break;
        }
        case F.error:
          status.textContent = 'error: ' + JSON.parse(dec.decode(p)).message;
          status.dataset.state = 'error';
          break;
      }
    };
    ws.onclose = (ev) => {
      if (closed) return;
      if (ev.code === 1013) {
        // The sandbox is being suspended: attach again from the offset
        // reached; the worker waits for the wake.
        status.textContent = 'sandbox suspending; reattaching…';
        setTimeout(attach, 1000);
        return;
      }
      if (status.dataset.state !== 'exited') {
        status.textContent = `disconnected (${ev.code})`;
        status.dataset.state = 'disconnected';
      }
    };
  };

  term.onData((d) => send(frame(F.stdin, d)));
  term.onBinary((d) => send(frame(F.stdin, Uint8Array.from(d, (c) => c.charCodeAt(0) & 0xff))));
  term.onResize(() => sendResize());
  const ro = new ResizeObserver(() => {
    try {
      fit.fit();
    } catch {
      // detached
    }
  });
  ro.observe(box);

  api('POST', `/v1/sandboxes/${encodeURIComponent(sandboxId)}/commands`, {
    argv: ['/bin/bash', '-l'],
    pty: { cols: term.cols, rows: term.rows },
    env: { TERM: 'xterm-256color' },
  })
    .then((c) => {
      url = c.attach_url;
      token = c.token;
      attach();
    })
    .catch((e) => {
      status.textContent = 'error: ' + e.message;
      status.dataset.state = 'error';
    });

  return () => {
    closed = true;
    ro.disconnect();
    // Processes outlive attachments: end the shell with the page.
    send(frame(F.signal, JSON.stringify({ signal: 'HUP' })));
    ws?.close(1000);
    term.dispose();
  };
}
