/**
 * Files of a sandbox, streamed over the worker's data plane with a
 * files-scoped token the control plane hands out.
 * @module
 */
import { send, sendJSON, type BodyInit } from './http.js';
import { UnauthorizedError, UnavailableError } from './errors.js';

/** A file or directory in a sandbox. */
export interface FileInfo {
  /** The absolute path. */
  path: string;
  /** The last element of the path. */
  name: string;
  /** `file`, `dir`, `symlink` or `other`. */
  type: 'file' | 'dir' | 'symlink' | 'other' | string;
  size: number;
  /** Octal permission bits, e.g. `0644`. */
  mode: string;
  uid: number;
  gid: number;
  owner?: string;
  mod_time: string;
  /** A symlink's target. */
  target?: string;
}

/** What the control plane answers to `POST /v1/sandboxes/{id}/files/session`. */
export interface FilesSession {
  url: string;
  token: string;
  expires_at?: string;
}

/** Options of {@link Files.write}. */
export interface WriteOptions {
  /** Octal permission bits of the file, e.g. `0644`. */
  mode?: string;
  /** Owner of the file (default `user`). */
  owner?: string;
}

/** Options of {@link Files.read}. */
export interface ReadOptions<F extends 'text' | 'bytes' | 'stream' = 'text'> {
  /** `text` (default): a string (UTF-8); `bytes`: a Uint8Array; `stream`: a ReadableStream of Uint8Array. */
  format?: F;
}

/** One page of a directory listing. */
export interface FileListPage {
  entries: FileInfo[];
  /** The cursor of the next page; undefined on the last. */
  nextCursor?: string;
}

type SessionSource = () => Promise<FilesSession>;

/**
 * The files of one sandbox (`sandbox.files`). A files session is opened on
 * first use and renewed before it expires (or when the data plane refuses it).
 */
export class Files {
  #open: SessionSource;
  #session: Promise<FilesSession> | undefined;
  #expires = 0;

  /** @internal Use `sandbox.files`. */
  constructor(open: SessionSource) {
    this.#open = open;
  }

  /** Forgets the files session (the next call opens a new one). */
  reset(): void {
    this.#session = undefined;
  }

  async #sess(): Promise<FilesSession> {
    if (!this.#session || Date.now() > this.#expires) {
      const p = this.#open();
      this.#session = p;
      p.then((s) => {
        const exp = s.expires_at ? Date.parse(s.expires_at) : NaN;
        // Renew a minute before the token's expiry (a session lasts an hour).
        this.#expires = Number.isFinite(exp) ? exp - 60_000 : Date.now() + 30 * 60_000;
      }, () => {
        if (this.#session === p) this.#session = undefined;
      });
    }
    return this.#session;
  }

  /** Runs fn with a session, once more with a new one if the first was refused or its worker is gone. */
  async #with<T>(fn: (s: FilesSession) => Promise<T>, retry = true): Promise<T> {
    const s = await this.#sess();
    try {
      return await fn(s);
    } catch (err) {
      if (retry && (err instanceof UnauthorizedError || (err instanceof UnavailableError && err.status === 0))) {
        this.reset();
        return this.#with(fn, false);
      }
      throw err;
    }
  }

  /**
   * Writes data into the file at path; parents are created and the file is
   * replaced atomically. Returns the written file's info.
   */
  async write(path: string, data: string | Uint8Array | ArrayBuffer | Blob | ReadableStream<Uint8Array>, opts: WriteOptions = {}): Promise<FileInfo> {
    let body: BodyInit;
    if (typeof data === 'string') body = new TextEncoder().encode(data);
    else body = data as BodyInit;
    // A stream can be sent only once: no retry for it.
    const once = typeof (data as ReadableStream).getReader === 'function';
    return this.#with((s) => sendJSON<FileInfo>(`${s.url}/content`, s.token, {
      method: 'PUT',
      query: { path, mode: opts.mode || undefined, owner: opts.owner || undefined },
      body,
      headers: { 'Content-Type': 'application/octet-stream' },
      dataPlane: true,
    }), !once);
  }

  /** Reads the file at path: a string by default, `{format: 'bytes'}` a Uint8Array, `{format: 'stream'}` a ReadableStream. */
  read(path: string, opts?: ReadOptions<'text'>): Promise<string>;
  read(path: string, opts: ReadOptions<'bytes'>): Promise<Uint8Array>;
  read(path: string, opts: ReadOptions<'stream'>): Promise<ReadableStream<Uint8Array>>;
  async read(path: string, opts: ReadOptions<'text' | 'bytes' | 'stream'> = {}): Promise<string | Uint8Array | ReadableStream<Uint8Array>> {
    const res = await this.#with((s) => send(`${s.url}/content`, s.token, { query: { path }, dataPlane: true, headers: { Accept: '*/*' } }));
    switch (opts.format ?? 'text') {
      case 'bytes':
        return new Uint8Array(await res.arrayBuffer());
      case 'stream':
        return res.body ?? new ReadableStream<Uint8Array>({ start: (c) => c.close() });
      default:
        return res.text();
    }
  }

  /** Describes path (without following a final symlink). */
  stat(path: string): Promise<FileInfo> {
    return this.#with((s) => sendJSON<FileInfo>(`${s.url}/stat`, s.token, { query: { path }, dataPlane: true }));
  }

  /** Whether path exists. */
  async exists(path: string): Promise<boolean> {
    try {
      await this.stat(path);
      return true;
    } catch (err) {
      if ((err as { status?: number }).status === 404) return false;
      throw err;
    }
  }

  /** Lists one page of the directory at path, sorted by name. */
  async listPage(path: string, opts: { limit?: number; cursor?: string } = {}): Promise<FileListPage> {
    const out = await this.#with((s) => sendJSON<{ entries?: FileInfo[]; next_cursor?: string }>(`${s.url}/list`, s.token, {
      query: { path, limit: opts.limit || undefined, cursor: opts.cursor || undefined },
      dataPlane: true,
    }));
    return { entries: out?.entries ?? [], nextCursor: out?.next_cursor || undefined };
  }

  /** Lists the directory at path (every page), sorted by name. */
  async list(path: string): Promise<FileInfo[]> {
    const all: FileInfo[] = [];
    let cursor: string | undefined;
    for (;;) {
      const page = await this.listPage(path, { cursor });
      all.push(...page.entries);
      if (!page.nextCursor) return all;
      if (page.nextCursor === cursor) throw new Error(`list ${path}: the data plane handed out the same cursor twice`);
      cursor = page.nextCursor;
    }
  }

  /** Makes the directory path and its parents. */
  mkdir(path: string, opts: WriteOptions = {}): Promise<FileInfo> {
    return this.#with((s) => sendJSON<FileInfo>(`${s.url}/mkdir`, s.token, {
      method: 'POST',
      json: { path, mode: opts.mode || undefined, owner: opts.owner || undefined },
      dataPlane: true,
    }));
  }

  /** Renames from to to; returns the entry at to. */
  move(from: string, to: string): Promise<FileInfo> {
    return this.#with((s) => sendJSON<FileInfo>(`${s.url}/move`, s.token, { method: 'POST', json: { from, to }, dataPlane: true }));
  }

  /** Removes path; a non-empty directory needs `{recursive: true}`. */
  async remove(path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    await this.#with((s) => send(s.url, s.token, { method: 'DELETE', query: { path, recursive: opts.recursive ? '1' : undefined }, dataPlane: true }));
  }
}
