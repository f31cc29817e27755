// The console's only client of the API: same-origin /v1 calls with the key
// the user signed in with (kept in sessionStorage: gone when the tab
// closes, never in a URL, never in a cookie).
const KEY = 'airlock.apiKey';

export function apiKey(): string | null {
  return sessionStorage.getItem(KEY);
}
export function setApiKey(k: string | null) {
  if (k) sessionStorage.setItem(KEY, k);
  else sessionStorage.removeItem(KEY);
}

export class APIError extends Error {
  constructor(
    public status: number,
    public code: string,
    message: string,
  ) {
    super(message);
  }
}

let onUnauthorized: () => void = () => {};
export function whenUnauthorized(f: () => void) {
  onUnauthorized = f;
}

async function errorOf(r: Response): Promise<APIError> {
  let code = 'http_' + r.status;
  let msg = `${r.status} ${r.statusText}`;
  try {
    const j = await r.json();
    if (j?.error) {
      code = j.error.code ?? code;
      msg = j.error.message ?? msg;
    }
  } catch {
    // not JSON
  }
  return new APIError(r.status, code, msg);
}

export async function api<T = any>(method: string, path: string, body?: unknown, signal?: AbortSignal): Promise<T> {
  const headers: Record<string, string> = { Authorization: `Bearer ${apiKey() ?? ''}` };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), signal });
  if (!r.ok) {
    const e = await errorOf(r);
    if (r.status === 401) onUnauthorized();
    throw e;
  }
  if (r.status === 204) return undefined as T;
  const text = await r.text();
  return (text ? JSON.parse(text) : undefined) as T;
}

/** A data-plane call (another origin): the token of a files session. */
export async function dataPlane(url: string, token: string, init: RequestInit = {}): Promise<Response> {
  const r = await fetch(url, { ...init, headers: { ...(init.headers ?? {}), Authorization: `Bearer ${token}` }, credentials: 'omit' });
  if (!r.ok) throw await errorOf(r);
  return r;
}

export interface AirlockEvent {
  seq: number;
  org_id: string;
  sandbox_id: string;
  type: string;
  data: any;
  time: string;
}

/**
 * Follows an SSE stream of /v1 with the key in Authorization (EventSource
 * cannot send it), resuming after the last seq on a disconnect.
 */
export function follow(path: string, onEvent: (e: AirlockEvent) => void, onStatus: (live: boolean) => void): () => void {
  const ctl = new AbortController();
  let after = 0;
  (async () => {
    while (!ctl.signal.aborted) {
      try {
        const r = await fetch(after ? `${path}?after=${after}` : path, {
          headers: { Authorization: `Bearer ${apiKey() ?? ''}`, Accept: 'text/event-stream' },
          signal: ctl.signal,
        });
        if (r.status === 401) {
          onUnauthorized();
          return;
        }
        if (!r.ok || !r.body) throw await errorOf(r);
        onStatus(true);
        const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value;
          let i;
          while ((i = buf.indexOf('\n\n')) >= 0) {
            const block = buf.slice(0, i);
            buf = buf.slice(i + 2);
            const data = block
              .split('\n')
              .filter((l) => l.startsWith('data:'))
              .map((l) => l.slice(5).trimStart())
              .join('\n');
            if (!data) continue;
            const ev = JSON.parse(data) as AirlockEvent;
            if (ev.seq > after) after = ev.seq;
            onEvent(ev);
          }
        }
      } catch (e) {
        if (ctl.signal.aborted) return;
      }
      onStatus(false);
      await new Promise((res) => setTimeout(res, 2000));
    }
  })();
  return () => ctl.abort();
}
