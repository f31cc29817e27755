/**
 * Typed errors of the Airlock SDK.
 *
 * Every non-2xx answer of the API (and of a worker's data plane) has the
 * body `{"error": {"code", "message"}}`; the SDK turns it into an
 * {@link AirlockError} of the subclass that matches its status and code, so
 * callers can write `if (err instanceof NotFoundError) …`.
 *
 * @module
 */

/** The operation record of the API, as far as the SDK reads it. */
export interface Operation {
  id: string;
  kind: string;
  state: 'pending' | 'running' | 'succeeded' | 'failed' | 'cancelled' | string;
  sandbox_id?: string;
  target?: string;
  reason?: string;
  created_at?: string;
  updated_at?: string;
  [key: string]: unknown;
}

/** Options of the {@link AirlockError} constructor. */
export interface AirlockErrorOptions {
  /** HTTP status of the answer; 0 when no answer came (a network error). */
  status: number;
  /** The API's error code, e.g. `not_found`. */
  code: string;
  /** The API's message (it says what to do next). */
  message: string;
  /** The underlying error, if any. */
  cause?: unknown;
}

/** The base class of every error the SDK throws for the API's answers. */
export class AirlockError extends Error {
  /** HTTP status of the answer; 0 when no answer came (a network error). */
  readonly status: number;
  /** The API's error code, e.g. `not_found`, `conflict`, `unprocessable`. */
  readonly code: string;

  constructor(opts: AirlockErrorOptions) {
    super(opts.message || `HTTP ${opts.status} ${opts.code}`, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = new.target.name;
    this.status = opts.status;
    this.code = opts.code;
  }
}

/** 404 (and 410): no such resource in your org, or a command whose record is gone. */
export class NotFoundError extends AirlockError {}
/** 409: the sandbox's state does not allow the request, or another operation is in progress. */
export class ConflictError extends AirlockError {}
/** 400 or 422: a malformed or invalid request (limits, unknown template, bad path, …). */
export class InvalidRequestError extends AirlockError {}
/** 401: a missing, invalid, revoked or expired API key (or data-plane token). */
export class UnauthorizedError extends AirlockError {}
/** 403: the key may not do this, or the org lacks a feature gate (e.g. `snapshots`). */
export class ForbiddenError extends AirlockError {}
/** 429 `quota_exceeded`: the org is at one of its quotas; retrying does not help. */
export class QuotaExceededError extends AirlockError {}

/** 429 `rate_limited`: the key's rate limit is used up; retry after {@link RateLimitedError.retryAfter} seconds. */
export class RateLimitedError extends AirlockError {
  /** Seconds to wait before retrying (the server's `Retry-After`), or undefined. */
  readonly retryAfter: number | undefined;
  constructor(opts: AirlockErrorOptions & { retryAfter?: number }) {
    super(opts);
    this.retryAfter = opts.retryAfter;
  }
}

/** 503, or no answer at all: a dependency is down (no worker, the sandbox's worker unreachable). */
export class UnavailableError extends AirlockError {
  /** Seconds to wait before retrying (the server's `Retry-After`), or undefined. */
  readonly retryAfter: number | undefined;
  constructor(opts: AirlockErrorOptions & { retryAfter?: number }) {
    super(opts);
    this.retryAfter = opts.retryAfter;
  }
}

/** An operation (create, pause, suspend, checkpoint, …) that ended `failed` or `cancelled`. */
export class OperationFailedError extends AirlockError {
  /** The operation as it ended; `reason` says why. */
  readonly operation: Operation;
  constructor(operation: Operation) {
    const msg = `operation ${operation.id} (${operation.kind} of ${operation.sandbox_id ?? '?'}) ${operation.state}` +
      (operation.reason ? `: ${operation.reason}` : '');
    super({ status: 0, code: `operation_${operation.state}`, message: msg });
    this.operation = operation;
  }
}

/**
 * Builds the typed error of a non-2xx answer from its status, body text and
 * `Retry-After` header. A body without the API's error shape keeps its text
 * as the message.
 */
export function errorFromResponse(status: number, bodyText: string, retryAfterHeader?: string | null, dataPlane = false): AirlockError {
  let code = '';
  let message = '';
  try {
    const b = JSON.parse(bodyText) as { error?: { code?: string; message?: string } };
    if (b && typeof b === 'object' && b.error && (b.error.code || b.error.message)) {
      code = b.error.code ?? '';
      message = b.error.message ?? '';
    }
  } catch {
    // not JSON: keep the text
  }
  if (!code && !message) message = bodyText.trim();
  if (!message) message = `HTTP ${status}`;
  if (!code) code = defaultCode(status);
  let retryAfter: number | undefined;
  if (retryAfterHeader) {
    const n = Number(retryAfterHeader);
    if (Number.isFinite(n)) retryAfter = n;
  }
  const opts = { status, code, message, retryAfter };
  switch (status) {
    case 400:
    case 422:
      return new InvalidRequestError(opts);
    case 401:
      return new UnauthorizedError(opts);
    case 403:
      return new ForbiddenError(opts);
    case 404:
    case 410:
      return new NotFoundError(opts);
    case 409:
      return new ConflictError(opts);
    case 429:
      return code === 'quota_exceeded' ? new QuotaExceededError(opts) : new RateLimitedError(opts);
    case 503:
      return new UnavailableError(opts);
    case 500:
      return new AirlockError(opts);
  }
  // A data-plane answer that names no known class (a proxy's 502, a worker
  // going away) is unavailable, as in the Go client.
  if (dataPlane || status === 502 || status === 504) return new UnavailableError(opts);
  return new AirlockError(opts);
}

function defaultCode(status: number): string {
  switch (status) {
    case 400: return 'bad_request';
    case 401: return 'unauthorized';
    case 403: return 'forbidden';
    case 404: return 'not_found';
    case 409: return 'conflict';
    case 410: return 'gone';
    case 413: return 'too_large';
    case 422: return 'unprocessable';
    case 429: return 'rate_limited';
    case 503: return 'unavailable';
    case 500: return 'internal';
    default: return `http_${status}`;
  }
}

/** Wraps a network failure (no answer) as an {@link UnavailableError}. */
export function networkError(what: string, cause: unknown): UnavailableError {
  const m = cause instanceof Error ? (cause.cause instanceof Error ? `${cause.message}: ${cause.cause.message}` : cause.message) : String(cause);
  return new UnavailableError({ status: 0, code: 'unavailable', message: `${what}: ${m}`, cause });
}
