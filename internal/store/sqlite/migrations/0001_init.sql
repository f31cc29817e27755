-- Airlock control-plane schema (SQLite).
-- Timestamps are TEXT in a fixed-width UTC layout
-- (2006-01-02T15:04:05.000000000Z), so text order is time order.
-- Maps, lists and structs are JSON text.

CREATE TABLE orgs (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    created_at TEXT NOT NULL
);

CREATE TABLE api_keys (
    id         TEXT PRIMARY KEY,
    org_id     TEXT NOT NULL REFERENCES orgs(id),
    name       TEXT NOT NULL,
    prefix     TEXT NOT NULL,
    hash       TEXT NOT NULL UNIQUE,
    admin      INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL
);

CREATE TABLE templates (
    name       TEXT NOT NULL,
    tag        TEXT NOT NULL,
    digest     TEXT NOT NULL,
    size_bytes INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL,
    PRIMARY KEY (name, tag)
);
CREATE INDEX templates_digest ON templates (digest);

CREATE TABLE sandboxes (
    id               TEXT PRIMARY KEY,
    org_id           TEXT NOT NULL REFERENCES orgs(id),
    template         TEXT NOT NULL,
    template_digest  TEXT NOT NULL,
    runtime          TEXT NOT NULL,
    state            TEXT NOT NULL,
    desired_state    TEXT NOT NULL,
    reason           TEXT NOT NULL DEFAULT '',
    worker_id        TEXT NOT NULL DEFAULT '',
    env              TEXT NOT NULL DEFAULT 'null',
    metadata         TEXT NOT NULL DEFAULT 'null',
    resources        TEXT NOT NULL DEFAULT '{}',
    timeout_s        INTEGER NOT NULL DEFAULT 0,
    generation       INTEGER NOT NULL,
    created_at       TEXT NOT NULL,
    updated_at       TEXT NOT NULL,
    last_activity_at TEXT NOT NULL,
    expires_at       TEXT
);
CREATE INDEX sandboxes_org_created ON sandboxes (org_id, created_at, id);
CREATE INDEX sandboxes_created ON sandboxes (created_at, id);
CREATE INDEX sandboxes_worker ON sandboxes (worker_id);
CREATE INDEX sandboxes_state ON sandboxes (state);

CREATE TABLE operations (
    id         TEXT PRIMARY KEY,
    org_id     TEXT NOT NULL,
    sandbox_id TEXT NOT NULL REFERENCES sandboxes(id),
    kind       TEXT NOT NULL,
    state      TEXT NOT NULL,
    target     TEXT NOT NULL,
    reason     TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    deadline   TEXT NOT NULL
);
CREATE INDEX operations_sandbox ON operations (sandbox_id, created_at);
CREATE INDEX operations_state ON operations (state);

CREATE TABLE idempotency_keys (
    org_id       TEXT NOT NULL,
    key          TEXT NOT NULL,
    sandbox_id   TEXT NOT NULL REFERENCES sandboxes(id),
    operation_id TEXT NOT NULL REFERENCES operations(id),
    created_at   TEXT NOT NULL,
    PRIMARY KEY (org_id, key)
);

CREATE TABLE workers (
    id              TEXT PRIMARY KEY,
    data_plane_url  TEXT NOT NULL,
    internal_url    TEXT NOT NULL,
    runtimes        TEXT NOT NULL DEFAULT 'null',
    templates       TEXT NOT NULL DEFAULT 'null',
    capacity_mib    INTEGER NOT NULL DEFAULT 0,
    capacity_vcpus  INTEGER NOT NULL DEFAULT 0,
    last_heartbeat  TEXT NOT NULL,
    created_at      TEXT NOT NULL
);

CREATE TABLE events (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    org_id       TEXT NOT NULL,
    sandbox_id   TEXT NOT NULL DEFAULT '',
    operation_id TEXT NOT NULL DEFAULT '',
    type         TEXT NOT NULL,
    data         TEXT NOT NULL DEFAULT '',
    time         TEXT NOT NULL
);
CREATE INDEX events_org ON events (org_id, seq);
CREATE INDEX events_sandbox ON events (sandbox_id, seq);

CREATE TABLE settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
