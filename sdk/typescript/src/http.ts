/**
 * The HTTP transport shared by the control plane and the data plane.
 * @internal
 * @module
 */
import { AirlockError, errorFromResponse, networkError } from './errors.js';

/** A request body fetch accepts. */
export type BodyInit = NonNullable<RequestInit['body']>;

/** Query parameters; arrays repeat the key, undefined values are left out. */
export type Query = Record<string, string | number | boolean | string[] | undefined>;

/** One request. */
export interface RequestOptions {
  method?: string;
  query?: Query;
  /** A JSON body (serialized), or a raw body. */
  json?: unknown;
  body?: BodyInit | null;
  headers?: Record<string, string>;
  signal?: AbortSignal;
  /** The answer is a data plane's: errors that name no class are unavailable. */
  dataPlane?: boolean;
}

/** Appends a query string to url. */
export function withQuery(url: string, query?: Query): string {
  if (!query) return url;
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) {
    if (v === undefined) continue;
    if (Array.isArray(v)) for (const x of v) q.append(k, x);
    else q.append(k, String(v));
  }
  const s = q.toString();
  if (!s) return url;
  return url + (url.includes('?') ? '&' : '?') + s;
}

/**
 * Sends a request with a bearer token and returns the 2xx response; any
 * other answer is thrown as the matching {@link AirlockError}.
 */
export async function send(url: string, token: string | undefined, opts: RequestOptions = {}): Promise<Response> {
  const headers: Record<string, string> = { Accept: 'application/json', ...opts.headers };
  if (token) headers.Authorization = `Bearer ${token}`;
  let body: BodyInit | null | undefined = opts.body;
  if (opts.json !== undefined) {
    body = JSON.stringify(opts.json);
    headers['Content-Type'] = 'application/json';
  }
  const method = opts.method ?? 'GET';
  const full = withQuery(url, opts.query);
  const init: RequestInit & { duplex?: 'half' } = { method, headers, body, signal: opts.signal };
  if (body && typeof (body as ReadableStream).getReader === 'function') init.duplex = 'half';
  let res: Response;
  try {
    res = await fetch(full, init);
  } catch (err) {
    if (opts.signal?.aborted) throw err;
    throw networkError(`${method} ${new URL(full).pathname}`, err);
  }
  if (res.status < 200 || res.status > 299) {
    const text = await res.text().catch(() => '');
    throw errorFromResponse(res.status, text, res.headers.get('Retry-After'), opts.dataPlane);
  }
  return res;
}

/** {@link send}, decoding a JSON answer (undefined for an empty one). */
export async function sendJSON<T>(url: string, token: string | undefined, opts: RequestOptions = {}): Promise<T> {
  const res = await send(url, token, opts);
  const text = await res.text();
  if (!text) return undefined as T;
  try {
    return JSON.parse(text) as T;
  } catch (err) {
    throw new AirlockError({ status: res.status, code: 'bad_answer', message: `decode answer of ${opts.method ?? 'GET'} ${url}: ${String(err)}`, cause: err });
  }
}

/** Resolves after ms milliseconds, or rejects when signal aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal!.reason);
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}
