/**
 * The Airlock client: sandboxes and their lifecycle, checkpoints, commands,
 * files, events, templates and networks.
 * @module
 */
import { AirlockError, OperationFailedError, RateLimitedError, UnavailableError, type Operation, errorFromResponse, networkError } from './errors.js';
import { send, sendJSON, sleep, type RequestOptions } from './http.js';
import { CommandHandle, type CommandOptions, type CommandResult, type CommandSession } from './commands.js';
import { Files, type FilesSession } from './files.js';

/** Options of the {@link Airlock} client. */
export interface AirlockOptions {
  /** The server's URL, e.g. `http://127.0.0.1:7070` (default: env `AIRLOCK_URL`). */
  url?: string;
  /** An API key, `al_…` (default: env `AIRLOCK_API_KEY`). */
  apiKey?: string;
}

/** Sandbox resources. */
export interface Resources {
  vcpus?: number;
  memory_mib?: number;
  disk_mib?: number;
}

/** A named checkpoint of a sandbox. */
export interface Checkpoint {
  name: string;
  snapshot_id: string;
  bytes: number;
  created_at: string;
}

/** `pending`, `starting`, `running`, `paused`, `suspending`, `suspended`, `waking`, `deleting`, `deleted` or `failed`. */
export type SandboxState = 'pending' | 'starting' | 'running' | 'paused' | 'suspending' | 'suspended' | 'waking' | 'deleting' | 'deleted' | 'failed' | 'lost';

/** The sandbox record of the API (`GET /v1/sandboxes/{id}`). */
export interface SandboxInfo {
  id: string;
  org_id: string;
  template: string;
  template_digest?: string;
  runtime: string;
  state: SandboxState;
  desired_state?: string;
  reason?: string;
  worker_id?: string;
  env?: Record<string, string>;
  metadata?: Record<string, string>;
  resources?: Resources;
  timeout_s?: number;
  generation?: number;
  created_at?: string;
  updated_at?: string;
  last_activity_at?: string;
  idle_suspend_after_s?: number;
  no_auto_wake?: boolean;
  snapshot_id?: string;
  snapshot_bytes?: number;
  snapshot_shared?: boolean;
  checkpoints?: Checkpoint[];
  /** The key to the sandbox's ports (absent for `publicTraffic` sandboxes). */
  traffic_token?: string;
  [key: string]: unknown;
}

/** A network policy request: a profile name or an inline policy (see docs/network.md). */
export type NetworkRequest = { profile: string; policy?: never } | { policy: Record<string, unknown>; profile?: never };

/** Options of {@link Sandboxes.create}. */
export interface CreateSandboxOptions {
  /** `name`, `name:tag` or `sha256:<hex>` (default `base`). */
  template?: string;
  /** `gvisor` (default) or a runtime a worker offers (e.g. `qemu`). */
  runtime?: string;
  resources?: Resources;
  env?: Record<string, string>;
  metadata?: Record<string, string>;
  /** Seconds until the sandbox expires (0: never). */
  timeoutS?: number;
  /** Suspend after this many idle seconds (0: never; default the org's, else 6 h). */
  idleSuspendAfterS?: number;
  /** `false`: commands and files on a paused or suspended sandbox are a 409 instead of waking it. */
  autoWake?: boolean;
  /** `true`: the sandbox's ports are reachable without its traffic token. */
  publicTraffic?: boolean;
  /** The egress policy (default: the org's default profile). */
  network?: NetworkRequest;
  /** Makes retries safe: a repeated key returns the first sandbox. */
  idempotencyKey?: string;
  /** `false`: return at once (state `pending`) instead of waiting until the sandbox runs. */
  wait?: boolean;
}

/** Options of a fork. */
export type ForkOptions = Pick<CreateSandboxOptions, 'env' | 'metadata' | 'timeoutS' | 'idleSuspendAfterS' | 'autoWake' | 'idempotencyKey' | 'wait'> & {
  /** How many forks (1 … 32, default 1). */
  count?: number;
};

/** Options of {@link Sandboxes.list}. */
export interface ListSandboxesOptions {
  /** Only sandboxes in these states (deleted ones are listed only when asked for). */
  state?: SandboxState | SandboxState[];
  /** Only sandboxes with all these metadata pairs. */
  metadata?: Record<string, string>;
  /** Page size (1 … 1000, default 100). */
  limit?: number;
}

/** One page of sandboxes. */
export interface SandboxPage {
  sandboxes: Sandbox[];
  /** The cursor of the next page; undefined on the last. */
  nextCursor?: string;
}

/** An event of the event stream. */
export interface AirlockEvent<T = unknown> {
  seq: number;
  org_id: string;
  sandbox_id?: string;
  operation_id?: string;
  /** `sandbox.state`, `operation.state`, `network.denied`, … */
  type: string;
  /** The sandbox (`sandbox.state`), the operation (`operation.state`) or the denial (`network.denied`). */
  data: T;
  time: string;
}

/** Options of {@link Airlock.events}. */
export interface EventsOptions {
  /** Only this sandbox's events (default: the whole org's). */
  sandboxId?: string;
  /** Start after this sequence number (default: from the oldest event). */
  after?: number;
  /** Aborting ends the iteration. */
  signal?: AbortSignal;
}

/** A template sandboxes can be created from. */
export interface Template {
  name: string;
  tag: string;
  digest: string;
  size_bytes?: number;
  created_at?: string;
  config?: Record<string, unknown>;
  workers?: string[];
  [key: string]: unknown;
}

/** A sandbox's egress network. */
export interface SandboxNetwork {
  profile?: string;
  policy?: Record<string, unknown>;
  [key: string]: unknown;
}

function createBody(o: CreateSandboxOptions | ForkOptions): Record<string, unknown> {
  const c = o as CreateSandboxOptions;
  const b: Record<string, unknown> = {};
  if (c.template) b.template = c.template;
  if (c.runtime) b.runtime = c.runtime;
  if (c.resources) b.resources = c.resources;
  if (o.env) b.env = o.env;
  if (o.metadata) b.metadata = o.metadata;
  if (o.timeoutS) b.timeout_s = o.timeoutS;
  if (o.idleSuspendAfterS !== undefined) b.idle_suspend_after_s = o.idleSuspendAfterS;
  if (o.autoWake !== undefined) b.auto_wake = o.autoWake;
  if (c.publicTraffic) b.public_traffic = true;
  if (c.network) b.network = c.network;
  return b;
}

/**
 * The client of one Airlock server.
 *
 * ```ts
 * const airlock = new Airlock(); // AIRLOCK_URL, AIRLOCK_API_KEY
 * const sb = await airlock.sandboxes.create({ template: 'base' });
 * const r = await sb.commands.run('echo hi');
 * await sb.delete();
 * ```
 */
export class Airlock {
  /** The server's base URL, without a trailing slash. */
  readonly url: string;
  readonly #apiKey: string;
  /** Sandboxes: create, get, list, fork, import. */
  readonly sandboxes: Sandboxes;
  /** Templates: list and get. */
  readonly templates: Templates;

  constructor(opts: AirlockOptions = {}) {
    const url = opts.url ?? process.env.AIRLOCK_URL;
    if (!url) throw new Error('Airlock: no server URL: pass {url} or set AIRLOCK_URL');
    this.url = url.replace(/\/+$/, '');
    this.#apiKey = opts.apiKey ?? process.env.AIRLOCK_API_KEY ?? '';
    this.sandboxes = new Sandboxes(this);
    this.templates = new Templates(this);
  }

  /**
   * Sends a request to the control plane and decodes its JSON answer; the
   * escape hatch for endpoints the SDK has no method for.
   * `path` starts with `/v1/…`.
   */
  request<T = unknown>(path: string, opts: RequestOptions = {}): Promise<T> {
    return sendJSON<T>(this.url + path, this.#apiKey, opts);
  }

  /** {@link request} returning the raw 2xx Response (for streams). */
  requestRaw(path: string, opts: RequestOptions = {}): Promise<Response> {
    return send(this.url + path, this.#apiKey, opts);
  }

  /** `GET /healthz`: resolves when a worker is ready; an {@link UnavailableError} with the reason otherwise. */
  async health(): Promise<{ status: string; reason?: string }> {
    return sendJSON(this.url + '/healthz', undefined);
  }

  /** Gets one operation. */
  getOperation(id: string): Promise<Operation> {
    return this.request<Operation>(`/v1/operations/${encodeURIComponent(id)}`);
  }

  /**
   * Long-polls the operation until it is done. Resolves with it when it
   * succeeded; rejects with {@link OperationFailedError} (carrying the
   * reason) when it failed or was cancelled.
   */
  async waitOperation(id: string, opts: { signal?: AbortSignal } = {}): Promise<Operation> {
    let unreachable = 0;
    for (;;) {
      let op: Operation;
      try {
        op = await this.request<Operation>(`/v1/operations/${encodeURIComponent(id)}`, { query: { wait: '30s' }, signal: opts.signal });
        unreachable = 0;
      } catch (err) {
        // 429 and 503 are retried after Retry-After (at least 1 s); a server
        // that does not answer at all, 10 times in a row, ends the wait.
        const noAnswer = err instanceof UnavailableError && err.status === 0;
        if ((err instanceof RateLimitedError || err instanceof UnavailableError) && !(noAnswer && ++unreachable > 10)) {
          await sleep(Math.max((err.retryAfter ?? 0) * 1000, 1000), opts.signal);
          continue;
        }
        throw err;
      }
      if (op.state === 'succeeded') return op;
      if (op.state === 'failed' || op.state === 'cancelled') throw new OperationFailedError(op);
    }
  }

  /**
   * Follows the event stream (Server-Sent Events) of one sandbox, or of the
   * whole org. A dropped connection is re-opened from the last event
   * received (`Last-Event-ID`), so no event is skipped or repeated; an API
   * error (e.g. a 404) is thrown. Break out of the loop (or abort
   * `signal`) to stop.
   *
   * ```ts
   * for await (const ev of airlock.events({ sandboxId: sb.id })) {
   *   if (ev.type === 'sandbox.state') console.log(ev.data.state);
   * }
   * ```
   */
  async *events<T = any>(opts: EventsOptions = {}): AsyncGenerator<AirlockEvent<T>, void, undefined> {
    const path = opts.sandboxId ? `/v1/sandboxes/${encodeURIComponent(opts.sandboxId)}/events` : '/v1/events';
    let last = opts.after ?? 0;
    let backoff = 100;
    const ctl = new AbortController();
    const onAbort = () => ctl.abort(opts.signal?.reason);
    if (opts.signal?.aborted) return;
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    try {
      for (;;) {
        let got = false;
        try {
          const headers: Record<string, string> = { Accept: 'text/event-stream' };
          if (last > 0) headers['Last-Event-ID'] = String(last);
          let res: Response;
          try {
            res = await fetch(this.url + path, { headers: { ...headers, Authorization: `Bearer ${this.#apiKey}` }, signal: ctl.signal });
          } catch (err) {
            if (ctl.signal.aborted) return;
            throw networkError(`GET ${path}`, err);
          }
          if (res.status !== 200) {
            const text = await res.text().catch(() => '');
            const e = errorFromResponse(res.status, text, res.headers.get('Retry-After'));
            throw Object.assign(e, { fatal: true });
          }
          for await (const ev of parseSSE<T>(res.body!)) {
            got = true;
            last = ev.seq;
            yield ev;
          }
        } catch (err) {
          if (ctl.signal.aborted) return;
          if (err instanceof AirlockError && (err as { fatal?: boolean }).fatal) throw err;
          // a broken stream: reconnect below
        }
        if (got) backoff = 100;
        try {
          await sleep(backoff, ctl.signal);
        } catch {
          return;
        }
        backoff = Math.min(2 * backoff, 5000);
      }
    } finally {
      opts.signal?.removeEventListener('abort', onAbort);
      ctl.abort();
    }
  }

  /** The built-in and the operators' network profiles. */
  async networkProfiles(): Promise<Record<string, unknown>[]> {
    const out = await this.request<{ profiles: Record<string, unknown>[] }>('/v1/network-profiles');
    return out.profiles ?? [];
  }
}

/** Parses a text/event-stream body into events (their `data` lines as JSON). */
async function* parseSSE<T>(body: ReadableStream<Uint8Array>): AsyncGenerator<AirlockEvent<T>> {
  const dec = new TextDecoder();
  let buf = '';
  let data: string[] = [];
  const reader = body.getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let i: number;
      while ((i = buf.indexOf('\n')) >= 0) {
        let line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        if (line.endsWith('\r')) line = line.slice(0, -1);
        if (line === '') {
          if (data.length) {
            const text = data.join('\n');
            data = [];
            yield JSON.parse(text) as AirlockEvent<T>;
          }
          continue;
        }
        if (line.startsWith(':')) continue;
        const c = line.indexOf(':');
        const field = c < 0 ? line : line.slice(0, c);
        let value2 = c < 0 ? '' : line.slice(c + 1);
        if (value2.startsWith(' ')) value2 = value2.slice(1);
        if (field === 'data') data.push(value2);
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
  throw new Error('event stream ended');
}

/** Sandboxes of the client's org (`airlock.sandboxes`). */
export class Sandboxes {
  readonly #c: Airlock;

  /** @internal */
  constructor(c: Airlock) {
    this.#c = c;
  }

  /**
   * Creates a sandbox and (unless `wait: false`) waits until it runs.
   * Rejects with {@link InvalidRequestError} for an unknown template or a
   * limit, {@link QuotaExceededError} at a quota, and
   * {@link OperationFailedError} if it could not start.
   */
  async create(opts: CreateSandboxOptions = {}): Promise<Sandbox> {
    const headers: Record<string, string> = {};
    if (opts.idempotencyKey) headers['Idempotency-Key'] = opts.idempotencyKey;
    const out = await this.#c.request<{ sandbox: SandboxInfo; operation: Operation }>('/v1/sandboxes', { method: 'POST', json: createBody(opts), headers });
    const sb = new Sandbox(this.#c, out.sandbox);
    if (opts.wait === false) return sb;
    await this.#c.waitOperation(out.operation.id);
    await sb.refresh();
    return sb;
  }

  /** Gets one sandbox (a deleted one too, with state `deleted`). */
  async get(id: string): Promise<Sandbox> {
    return new Sandbox(this.#c, await this.#c.request<SandboxInfo>(`/v1/sandboxes/${encodeURIComponent(id)}`));
  }

  /** Lists one page of sandboxes, ordered by creation time. */
  async listPage(opts: ListSandboxesOptions & { cursor?: string } = {}): Promise<SandboxPage> {
    const metadata = opts.metadata ? Object.entries(opts.metadata).map(([k, v]) => `${k}=${v}`) : undefined;
    const state = opts.state === undefined ? undefined : Array.isArray(opts.state) ? opts.state : [opts.state];
    const out = await this.#c.request<{ sandboxes?: SandboxInfo[]; next_cursor?: string }>('/v1/sandboxes', {
      query: { state, metadata, limit: opts.limit, cursor: opts.cursor || undefined },
    });
    return { sandboxes: (out.sandboxes ?? []).map((s) => new Sandbox(this.#c, s)), nextCursor: out.next_cursor || undefined };
  }

  /**
   * Every sandbox that matches, page after page, as an async iterator:
   * `for await (const sb of airlock.sandboxes.list({metadata: {team: 'a'}}))`.
   */
  async *list(opts: ListSandboxesOptions = {}): AsyncGenerator<Sandbox, void, undefined> {
    let cursor: string | undefined;
    for (;;) {
      const page = await this.listPage({ ...opts, cursor });
      yield* page.sandboxes;
      if (!page.nextCursor || page.nextCursor === cursor) return;
      cursor = page.nextCursor;
    }
  }

  /** Collects {@link list} into an array. */
  async listAll(opts: ListSandboxesOptions = {}): Promise<Sandbox[]> {
    const all: Sandbox[] = [];
    for await (const s of this.list(opts)) all.push(s);
    return all;
  }

  /**
   * Forks new sandboxes from a checkpoint of a sandbox (feature gate
   * `snapshots`) and (unless `wait: false`) waits until each runs.
   */
  async fork(from: { sandboxId: string; checkpoint: string }, opts: ForkOptions = {}): Promise<Sandbox[]> {
    const headers: Record<string, string> = {};
    if (opts.idempotencyKey) headers['Idempotency-Key'] = opts.idempotencyKey;
    const body = { ...createBody(opts), from_checkpoint: { sandbox_id: from.sandboxId, checkpoint: from.checkpoint }, count: opts.count || undefined };
    const out = await this.#c.request<{ sandbox: SandboxInfo; operation: Operation; forks?: { sandbox: SandboxInfo; operation: Operation }[] }>('/v1/sandboxes', { method: 'POST', json: body, headers });
    const forks = out.forks?.length ? out.forks : [{ sandbox: out.sandbox, operation: out.operation }];
    const sbs = forks.map((f) => new Sandbox(this.#c, f.sandbox));
    if (opts.wait === false) return sbs;
    await Promise.all(forks.map((f) => this.#c.waitOperation(f.operation.id)));
    await Promise.all(sbs.map((s) => s.refresh()));
    return sbs;
  }

  /**
   * Imports a sandbox from an exported checkpoint archive (a tar, see
   * {@link Sandbox.exportCheckpoint}) and (unless `wait: false`) waits until it runs.
   */
  async import(archive: Uint8Array | Blob, opts: Pick<CreateSandboxOptions, 'env' | 'metadata' | 'timeoutS' | 'idleSuspendAfterS' | 'autoWake' | 'idempotencyKey' | 'wait'> = {}): Promise<Sandbox> {
    const form = new FormData();
    form.append('request', new Blob([JSON.stringify({ ...createBody(opts), import: 'archive' })], { type: 'application/json' }));
    form.append('archive', archive instanceof Blob ? archive : new Blob([archive], { type: 'application/x-tar' }), 'archive.tar');
    const headers: Record<string, string> = {};
    if (opts.idempotencyKey) headers['Idempotency-Key'] = opts.idempotencyKey;
    const out = await this.#c.request<{ sandbox: SandboxInfo; operation: Operation }>('/v1/sandboxes', { method: 'POST', body: form, headers });
    const sb = new Sandbox(this.#c, out.sandbox);
    if (opts.wait === false) return sb;
    await this.#c.waitOperation(out.operation.id);
    await sb.refresh();
    return sb;
  }
}

/** Templates (`airlock.templates`). */
export class Templates {
  readonly #c: Airlock;
  /** @internal */
  constructor(c: Airlock) {
    this.#c = c;
  }
  /** Lists the templates sandboxes can be created from. */
  async list(): Promise<Template[]> {
    const out = await this.#c.request<{ templates?: Template[] }>('/v1/templates');
    return out.templates ?? [];
  }
  /** Gets one template (`name`, `name:tag` or `sha256:<hex>`) with the workers that hold it. */
  get(ref: string): Promise<Template> {
    return this.#c.request<Template>(`/v1/templates/${encodeURIComponent(ref)}`);
  }
}

/** A sandbox. Its record is a snapshot: {@link Sandbox.refresh} reads it again. */
export class Sandbox {
  readonly #c: Airlock;
  #info: SandboxInfo;
  /** Commands: run, start. */
  readonly commands: Commands;
  /** Files: read, write, list, stat, mkdir, move, remove. */
  readonly files: Files;

  /** @internal Use `airlock.sandboxes`. */
  constructor(c: Airlock, info: SandboxInfo) {
    this.#c = c;
    this.#info = info;
    this.commands = new Commands(c, info.id);
    this.files = new Files(() => c.request<FilesSession>(`/v1/sandboxes/${encodeURIComponent(info.id)}/files/session`, { method: 'POST', json: {} }));
  }

  /** The sandbox's id (`sb-…`). */
  get id(): string {
    return this.#info.id;
  }
  /** The state at the last read. */
  get state(): SandboxState {
    return this.#info.state;
  }
  /** The metadata at the last read. */
  get metadata(): Record<string, string> {
    return this.#info.metadata ?? {};
  }
  /** The template at the last read. */
  get template(): string {
    return this.#info.template;
  }
  /** The whole record at the last read. */
  get info(): SandboxInfo {
    return this.#info;
  }

  /** Reads the record again and returns this sandbox. */
  async refresh(): Promise<this> {
    this.#info = await this.#c.request<SandboxInfo>(`/v1/sandboxes/${encodeURIComponent(this.id)}`);
    return this;
  }

  async #lifecycle(verb: 'pause' | 'resume' | 'suspend' | 'wake'): Promise<this> {
    const out = await this.#c.request<{ operation: Operation }>(`/v1/sandboxes/${encodeURIComponent(this.id)}/${verb}`, { method: 'POST', json: {} });
    await this.#c.waitOperation(out.operation.id);
    this.files.reset();
    return this.refresh();
  }

  /** Pauses a running sandbox (its processes stop, memory stays) and waits for it. */
  pause(): Promise<this> {
    return this.#lifecycle('pause');
  }
  /** Resumes a paused sandbox and waits for it. */
  resume(): Promise<this> {
    return this.#lifecycle('resume');
  }
  /** Suspends a running or paused sandbox to a snapshot and waits for it. */
  suspend(): Promise<this> {
    return this.#lifecycle('suspend');
  }
  /** Wakes a suspended (or paused) sandbox and waits until it runs. */
  wake(): Promise<this> {
    return this.#lifecycle('wake');
  }
  /** Deletes the sandbox (and its checkpoints) and waits for it; the state is `deleted` afterwards. */
  async delete(): Promise<void> {
    const out = await this.#c.request<{ operation: Operation }>(`/v1/sandboxes/${encodeURIComponent(this.id)}`, { method: 'DELETE' });
    await this.#c.waitOperation(out.operation.id);
    await this.refresh().catch(() => {
      this.#info = { ...this.#info, state: 'deleted' };
    });
  }

  /** Checkpoints the running or paused sandbox under name (feature gate `snapshots`) and waits for it. */
  async checkpoint(name: string): Promise<Checkpoint> {
    const out = await this.#c.request<{ operation: Operation }>(`/v1/sandboxes/${encodeURIComponent(this.id)}/checkpoints`, { method: 'POST', json: { name } });
    await this.#c.waitOperation(out.operation.id);
    const cp = (await this.checkpoints()).find((c) => c.name === name);
    if (!cp) throw new AirlockError({ status: 0, code: 'not_found', message: `checkpoint ${name} of ${this.id} is not listed after its operation succeeded` });
    return cp;
  }
  /** The sandbox's completed checkpoints, oldest first. */
  async checkpoints(): Promise<Checkpoint[]> {
    const out = await this.#c.request<{ checkpoints?: Checkpoint[] }>(`/v1/sandboxes/${encodeURIComponent(this.id)}/checkpoints`);
    return out.checkpoints ?? [];
  }
  /** Rolls the sandbox back to a checkpoint (memory, processes, files) and waits until it runs. */
  async rollback(checkpoint: string): Promise<this> {
    const out = await this.#c.request<{ operation: Operation }>(`/v1/sandboxes/${encodeURIComponent(this.id)}/rollback`, { method: 'POST', json: { checkpoint } });
    await this.#c.waitOperation(out.operation.id);
    this.files.reset();
    return this.refresh();
  }
  /** Forks new sandboxes from one of this sandbox's checkpoints; see {@link Sandboxes.fork}. */
  fork(checkpoint: string, opts: ForkOptions = {}): Promise<Sandbox[]> {
    return this.#c.sandboxes.fork({ sandboxId: this.id, checkpoint }, opts);
  }
  /** Exports a checkpoint as a portable tar archive, streamed. Keep it only if the stream completes. */
  async exportCheckpoint(name: string): Promise<ReadableStream<Uint8Array>> {
    const res = await this.#c.requestRaw(`/v1/sandboxes/${encodeURIComponent(this.id)}/checkpoints/${encodeURIComponent(name)}/export`, { headers: { Accept: 'application/x-tar' } });
    return res.body!;
  }

  /** The sandbox's egress network policy. */
  network(): Promise<SandboxNetwork | null> {
    return this.#c.request<SandboxNetwork | null>(`/v1/sandboxes/${encodeURIComponent(this.id)}/network`);
  }
  /** Replaces the sandbox's egress network policy. */
  setNetwork(req: NetworkRequest): Promise<SandboxNetwork> {
    return this.#c.request<SandboxNetwork>(`/v1/sandboxes/${encodeURIComponent(this.id)}/network`, { method: 'PUT', json: req });
  }
  /** Reads the sandbox's network log (allowed and denied egress) after seq `after`. */
  networkLog(opts: { after?: number; limit?: number } = {}): Promise<{ entries: Record<string, unknown>[]; next?: number; [k: string]: unknown }> {
    return this.#c.request(`/v1/sandboxes/${encodeURIComponent(this.id)}/network/log`, { query: { after: opts.after, limit: opts.limit } });
  }
  /** This sandbox's events; see {@link Airlock.events}. */
  events<T = any>(opts: Omit<EventsOptions, 'sandboxId'> = {}): AsyncGenerator<AirlockEvent<T>, void, undefined> {
    return this.#c.events<T>({ ...opts, sandboxId: this.id });
  }
}

/** The commands of one sandbox (`sandbox.commands`). */
export class Commands {
  readonly #c: Airlock;
  readonly #id: string;

  /** @internal */
  constructor(c: Airlock, sandboxId: string) {
    this.#c = c;
    this.#id = sandboxId;
  }

  /**
   * Starts a command and returns its handle at once. `cmd` runs as
   * `/bin/bash -lc <cmd>` (the base template has `sh`: bash is used when
   * present); pass `argv` to run a program directly.
   */
  async start(cmd: string, opts: CommandOptions = {}): Promise<CommandHandle> {
    const body: Record<string, unknown> = {};
    if (opts.argv?.length) body.argv = opts.argv;
    else body.cmd = cmd;
    if (opts.env) body.env = opts.env;
    if (opts.cwd) body.cwd = opts.cwd;
    if (opts.user) body.user = opts.user;
    if (opts.stdin !== undefined && opts.stdin !== false) body.stdin = true;
    if (opts.timeoutS) body.timeout_s = opts.timeoutS;
    if (opts.pty) body.pty = { cols: opts.pty.cols, rows: opts.pty.rows };
    const session = await this.#c.request<CommandSession>(`/v1/sandboxes/${encodeURIComponent(this.#id)}/commands`, { method: 'POST', json: body });
    return new CommandHandle(session, opts);
  }

  /** Runs a command to completion and returns its exit code and output. */
  async run(cmd: string, opts: CommandOptions = {}): Promise<CommandResult> {
    const h = await this.start(cmd, opts);
    return h.wait();
  }

  /** Lists the processes started in the sandbox (running and finished), every page. */
  async list(): Promise<Record<string, unknown>[]> {
    const all: Record<string, unknown>[] = [];
    let cursor: string | undefined;
    for (;;) {
      const out = await this.#c.request<{ commands?: Record<string, unknown>[]; next_cursor?: string }>(`/v1/sandboxes/${encodeURIComponent(this.#id)}/commands`, { query: { cursor } });
      all.push(...(out.commands ?? []));
      if (!out.next_cursor || out.next_cursor === cursor) return all;
      cursor = out.next_cursor;
    }
  }
}
