/**
 * Commands: creating a command session on the control plane and attaching
 * to it over the worker's WebSocket (the data plane).
 * @module
 */
import WebSocket from 'ws';
import { AirlockError, UnavailableError, NotFoundError, UnauthorizedError, ForbiddenError, InvalidRequestError, ConflictError, errorFromResponse, networkError } from './errors.js';
import { sleep } from './http.js';

/** Frame kinds of the attach WebSocket (docs/api.md, "The attach WebSocket"). */
export const Frame = {
  Stdout: 1,
  Stderr: 2,
  Exit: 3,
  Started: 4,
  Error: 5,
  Stdin: 16,
  StdinClose: 17,
  Signal: 18,
  Resize: 19,
} as const;

/** The most bytes one frame's payload may carry. */
export const MAX_FRAME_PAYLOAD = 1 << 20;

/** How many times a command stream is re-attached in a row without receiving anything before giving up. */
export const ATTACH_RETRIES = 5;

/** What the control plane answers to a new command (`POST /v1/sandboxes/{id}/commands`). */
export interface CommandSession {
  id: string;
  attach_url: string;
  token: string;
  expires_at?: string;
}

/** A terminal size. */
export interface PtySize {
  cols: number;
  rows: number;
}

/** Options of {@link Commands.run} and {@link Commands.start}. */
export interface CommandOptions {
  /** Run this argv instead of `cmd` (then `cmd` is ignored and may be empty). */
  argv?: string[];
  /** Extra environment of the command. */
  env?: Record<string, string>;
  /** Working directory (default: the user's home). */
  cwd?: string;
  /** User to run as (default `user`). */
  user?: string;
  /**
   * Stdin: text or bytes are sent and stdin is closed after them; `true`
   * keeps stdin open for {@link CommandHandle.sendStdin} (start only).
   * Without it the command gets no stdin.
   */
  stdin?: string | Uint8Array | boolean;
  /** Kill the command after this many seconds (0: no limit). */
  timeoutS?: number;
  /** Called with each chunk of stdout, decoded as UTF-8. */
  onStdout?: (text: string) => void;
  /** Called with each chunk of stderr, decoded as UTF-8. */
  onStderr?: (text: string) => void;
  /** Run on a pseudo-terminal of this size (output arrives as stdout; stdin is keystrokes). */
  pty?: PtySize;
  /** Aborting detaches from the command (it keeps running in the sandbox). */
  signal?: AbortSignal;
}

/** The end of a command. */
export interface CommandExit {
  /** The exit status; -1 when a signal ended the command. */
  exitCode: number;
  /** The signal that ended it (e.g. `KILL`), if one did. */
  signal?: string;
  /** Whether `timeoutS` killed it. */
  timedOut: boolean;
  /** Why the program could not run, if it could not. */
  error?: string;
}

/** The result of a finished command: its exit plus its whole output. */
export interface CommandResult extends CommandExit {
  stdout: string;
  stderr: string;
}

/** One piece of a command's output, as {@link CommandHandle} iterates it. */
export interface OutputEvent {
  type: 'stdout' | 'stderr';
  /** The raw bytes. */
  data: Uint8Array;
  /** The bytes decoded as UTF-8 (a character split across chunks is decoded whole in the chunk that completes it). */
  text: string;
}

type PumpResult = { exit?: CommandExit; fatal?: unknown; progressed: boolean; reason?: string };

type Queued = { kind: 'event'; ev: OutputEvent } | { kind: 'end' } | { kind: 'error'; err: unknown };

function frame(kind: number, payload?: Uint8Array): Buffer {
  const b = Buffer.allocUnsafe(1 + (payload?.length ?? 0));
  b[0] = kind;
  if (payload) b.set(payload, 1);
  return b;
}

/** Whether an attach failure is worth another attach (mirrors the Go client). */
function retryable(err: unknown): boolean {
  if (err instanceof UnavailableError) return true;
  return !(err instanceof NotFoundError || err instanceof UnauthorizedError || err instanceof ForbiddenError ||
    err instanceof InvalidRequestError || err instanceof ConflictError);
}

/**
 * A running command. Iterate it (`for await (const ev of handle)`) for its
 * output as it comes, send it stdin and signals, and `await handle.wait()`
 * for its exit and whole output.
 *
 * A dropped connection, or a close with code 1013 (the sandbox is being
 * suspended), is re-attached from the output offset reached, so no output
 * is lost or repeated.
 */
export class CommandHandle implements AsyncIterable<OutputEvent> {
  /** The command's id (`cmd-…`). */
  readonly id: string;
  /** The process info of the `started` frame, once it came. */
  started: Record<string, unknown> | undefined;

  #session: CommandSession;
  #opts: CommandOptions;
  #ws: WebSocket | undefined;
  #connecting: WebSocket | undefined;
  #wsWaiters: Array<() => void> = [];
  #offset = 0;
  #done = false;
  #detached = false;
  #stdout: string[] = [];
  #stderr: string[] = [];
  #dec = { stdout: new TextDecoder('utf-8'), stderr: new TextDecoder('utf-8') };
  #queue: Queued[] = [];
  #pull: (() => void) | undefined;
  #iterating = false;
  #result: Promise<CommandResult>;
  #sendChain: Promise<void> = Promise.resolve();

  /** @internal Use {@link Commands.start}. */
  constructor(session: CommandSession, opts: CommandOptions) {
    this.id = session.id;
    this.#session = session;
    this.#opts = opts;
    this.#result = this.#run();
    this.#result.catch(() => {}); // the error reaches wait() and the iterator
    const data = opts.stdin;
    if (typeof data === 'string' || data instanceof Uint8Array) {
      this.sendStdin(data).then(() => this.closeStdin()).catch(() => {});
    }
    if (opts.signal) {
      const onAbort = () => this.detach();
      if (opts.signal.aborted) onAbort();
      else opts.signal.addEventListener('abort', onAbort, { once: true });
    }
  }

  /** Resolves with the exit and whole output once the command ends; rejects if the stream is lost. */
  wait(): Promise<CommandResult> {
    return this.#result;
  }

  /** Sends bytes (or UTF-8 text) to the command's stdin; it needs `stdin: true` (or `pty`). */
  sendStdin(data: string | Uint8Array): Promise<void> {
    const bytes = typeof data === 'string' ? new TextEncoder().encode(data) : data;
    const chunks: Uint8Array[] = [];
    for (let i = 0; i < bytes.length; i += MAX_FRAME_PAYLOAD) chunks.push(bytes.subarray(i, i + MAX_FRAME_PAYLOAD));
    return this.#enqueueSend(chunks.map((c) => frame(Frame.Stdin, c)));
  }

  /** Closes the command's stdin after everything sent so far. */
  closeStdin(): Promise<void> {
    return this.#enqueueSend([frame(Frame.StdinClose)]);
  }

  /** Sends a signal to every process of the command: a name (`TERM`, `KILL`, `INT`, …) or a number. */
  signal(sig: string | number = 'TERM'): Promise<void> {
    return this.#enqueueSend([frame(Frame.Signal, new TextEncoder().encode(JSON.stringify({ signal: String(sig) })))]);
  }

  /** Kills the command (signal `KILL`). */
  kill(): Promise<void> {
    return this.signal('KILL');
  }

  /** Changes the size of a `pty` command's terminal. */
  resize(cols: number, rows: number): Promise<void> {
    return this.#enqueueSend([frame(Frame.Resize, new TextEncoder().encode(JSON.stringify({ cols, rows })))]);
  }

  /** Detaches from the command without stopping it; wait() then rejects. */
  detach(): void {
    this.#detached = true;
    this.#ws?.terminate();
    this.#connecting?.terminate();
  }

  /** The output as it comes; the iteration ends at the exit (and throws if the stream is lost). */
  async *[Symbol.asyncIterator](): AsyncIterator<OutputEvent> {
    if (this.#iterating) throw new Error('a command handle can be iterated only once');
    this.#iterating = true;
    for (;;) {
      const item = this.#queue.shift();
      if (!item) {
        await new Promise<void>((r) => (this.#pull = r));
        continue;
      }
      if (item.kind === 'end') return;
      if (item.kind === 'error') throw item.err;
      yield item.ev;
    }
  }

  #push(q: Queued): void {
    this.#queue.push(q);
    const p = this.#pull;
    this.#pull = undefined;
    p?.();
  }

  #enqueueSend(frames: Buffer[]): Promise<void> {
    const p = this.#sendChain.then(async () => {
      for (const f of frames) await this.#sendFrame(f);
    });
    this.#sendChain = p.catch(() => {});
    return p;
  }

  /** Sends one frame on the current connection, retrying on the next one when it drops. */
  async #sendFrame(f: Buffer): Promise<void> {
    let last: WebSocket | undefined;
    for (;;) {
      if (this.#done) throw new AirlockError({ status: 0, code: 'command_ended', message: `command ${this.id} has ended` });
      if (this.#detached) throw new AirlockError({ status: 0, code: 'detached', message: `detached from command ${this.id}` });
      const ws = this.#ws;
      if (ws && ws !== last && ws.readyState === WebSocket.OPEN) {
        const err = await new Promise<Error | undefined>((r) => ws.send(f, (e) => r(e ?? undefined)));
        if (!err) return;
        last = ws;
      }
      await new Promise<void>((r) => this.#wsWaiters.push(r));
    }
  }

  #setWs(ws: WebSocket | undefined): void {
    this.#ws = ws;
    const ws2 = this.#wsWaiters;
    this.#wsWaiters = [];
    for (const w of ws2) w();
  }

  async #run(): Promise<CommandResult> {
    let failures = 0;
    let reattach = false;
    try {
      for (;;) {
        if (this.#detached) throw new AirlockError({ status: 0, code: 'detached', message: `detached from command ${this.id}` });
        const att = this.#attach();
        try {
          await att.opened;
        } catch (err) {
          // A re-attach can meet the lifecycle operation that cut the stream
          // (a suspend still in progress or settling): that 409 says to wait
          // and retry.
          const busy = reattach && err instanceof ConflictError && /in progress|wait for it and retry/.test(err.message);
          if (this.#detached || !(busy || retryable(err)) || failures >= ATTACH_RETRIES) throw err;
          failures++;
          await sleep(failures * (busy ? 500 : 200));
          continue;
        }
        reattach = true;
        const r = await att.result;
        if (r.exit) {
          const res: CommandResult = { ...r.exit, stdout: this.#stdout.join('') + this.#dec.stdout.decode(), stderr: this.#stderr.join('') + this.#dec.stderr.decode() };
          this.#done = true;
          this.#setWs(undefined);
          this.#push({ kind: 'end' });
          return res;
        }
        if (r.fatal) throw r.fatal;
        if (r.progressed) failures = 0;
        if (this.#detached) throw new AirlockError({ status: 0, code: 'detached', message: `detached from command ${this.id}` });
        if (failures >= ATTACH_RETRIES) {
          throw new UnavailableError({ status: 0, code: 'unavailable', message: `command ${this.id}: stream lost after ${failures} re-attaches: ${r.reason}` });
        }
        failures++;
        await sleep(failures * 100);
      }
    } catch (err) {
      this.#done = true;
      this.#setWs(undefined);
      this.#push({ kind: 'error', err });
      throw err;
    }
  }

  /**
   * Opens one attachment from the current offset. `opened` settles when the
   * WebSocket opens (or fails to); `result` when the attachment ends. The
   * frame listener is installed before the socket opens: frames that came
   * with the upgrade answer are emitted right after 'open'.
   */
  #attach(): { opened: Promise<void>; result: Promise<PumpResult> } {
    const u = new URL(this.#session.attach_url);
    u.searchParams.set('offset', String(this.#offset));
    const ws = new WebSocket(u, {
      headers: { Authorization: `Bearer ${this.#session.token}` },
      maxPayload: MAX_FRAME_PAYLOAD + 1,
      perMessageDeflate: false,
    });
    this.#connecting = ws;
    const result = this.#pump(ws);
    result.catch(() => {});
    const opened = new Promise<void>((resolve, reject) => {
      let settled = false;
      ws.once('open', () => {
        settled = true;
        this.#setWs(ws);
        resolve();
      });
      ws.once('unexpected-response', (_req, res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          settled = true;
          const status = res.statusCode ?? 0;
          const text = Buffer.concat(chunks).toString('utf8');
          reject(status >= 200 && status < 300
            ? new UnavailableError({ status, code: 'unavailable', message: `attach: unexpected answer ${status}` })
            : errorFromResponse(status, text, res.headers['retry-after'] as string | undefined, true));
          ws.terminate();
        });
        res.on('error', (e) => {
          settled = true;
          reject(networkError('attach', e));
        });
      });
      ws.once('error', (e) => {
        if (!settled) {
          settled = true;
          reject(networkError('attach', e));
        }
      });
    });
    return { opened, result };
  }

  /** Reads frames until the exit, an error frame, or a broken connection. */
  #pump(ws: WebSocket): Promise<PumpResult> {
    return new Promise((resolve) => {
      let progressed = false;
      let exit: CommandExit | undefined;
      let fatal: unknown;
      ws.on('message', (data: Buffer, isBinary: boolean) => {
        if (!isBinary || data.length === 0 || exit || fatal) return;
        const kind = data[0];
        const payload = new Uint8Array(data.buffer, data.byteOffset + 1, data.length - 1);
        switch (kind) {
          case Frame.Stdout:
          case Frame.Stderr: {
            const type = kind === Frame.Stdout ? 'stdout' : 'stderr';
            const copy = new Uint8Array(payload);
            this.#offset += copy.length;
            progressed = true;
            const text = this.#dec[type].decode(copy, { stream: true });
            (type === 'stdout' ? this.#stdout : this.#stderr).push(text);
            this.#push({ kind: 'event', ev: { type, data: copy, text } });
            try {
              (type === 'stdout' ? this.#opts.onStdout : this.#opts.onStderr)?.(text);
            } catch {
              // a callback's error is the caller's
            }
            break;
          }
          case Frame.Started:
            try {
              this.started = JSON.parse(Buffer.from(payload).toString('utf8'));
            } catch {
              // ignore a malformed started frame
            }
            break;
          case Frame.Exit: {
            try {
              const e = JSON.parse(Buffer.from(payload).toString('utf8')) as { exit_code: number; signal?: string; timed_out?: boolean; error?: string };
              exit = { exitCode: e.exit_code, timedOut: !!e.timed_out };
              if (e.signal) exit.signal = e.signal;
              if (e.error) exit.error = e.error;
            } catch (err) {
              fatal = new AirlockError({ status: 0, code: 'bad_frame', message: `decode exit frame: ${String(err)}` });
            }
            ws.close(1000);
            break;
          }
          case Frame.Error: {
            let message = 'command stream error';
            try {
              message = JSON.parse(Buffer.from(payload).toString('utf8')).message ?? message;
            } catch {
              // keep the default
            }
            fatal = new UnavailableError({ status: 0, code: 'unavailable', message: `command stream: ${message}` });
            ws.close(1000);
            break;
          }
        }
      });
      ws.once('close', (code: number, reason: Buffer) => {
        if (this.#ws === ws) this.#setWs(undefined);
        if (exit) return resolve({ exit, progressed });
        if (fatal) return resolve({ fatal, progressed });
        resolve({ progressed, reason: code === 1013 ? 'the sandbox is being suspended (1013)' : `closed with ${code} ${reason.toString('utf8')}`.trim() });
      });
      ws.on('error', () => {
        // a 'close' follows
      });
    });
  }
}

