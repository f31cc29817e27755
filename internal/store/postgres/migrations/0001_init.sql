-- Airlock control-plane schema (PostgreSQL).
-- Timestamps are timestamptz (microsecond precision). Maps, lists and
-- structs are jsonb; event payloads are text so their bytes round-trip.

CREATE TABLE orgs (
    id         text PRIMARY KEY,
    name       text NOT NULL,
    created_at timestamptz NOT NULL
);

CREATE TABLE api_keys (
    id         text PRIMARY KEY,
    org_id     text NOT NULL REFERENCES orgs(id),
    name       text NOT NULL,
    prefix     text NOT NULL,
    hash       text NOT NULL UNIQUE,
    admin      boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL
);

CREATE TABLE templates (
    name       text NOT NULL,
    tag        text NOT NULL,
    digest     text NOT NULL,
    size_bytes bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (name, tag)
);
CREATE INDEX templates_digest ON templates (digest);

CREATE TABLE sandboxes (
    id               text PRIMARY KEY,
    org_id           text NOT NULL REFERENCES orgs(id),
    template         text NOT NULL,
    template_digest  text NOT NULL,
    runtime          text NOT NULL,
    state            text NOT NULL,
    desired_state    text NOT NULL,
    reason           text NOT NULL DEFAULT '',
    worker_id        text NOT NULL DEFAULT '',
    env              jsonb NOT NULL DEFAULT 'null',
    metadata         jsonb NOT NULL DEFAULT 'null',
    resources        jsonb NOT NULL DEFAULT '{}',
    timeout_s        integer NOT NULL DEFAULT 0,
    generation       bigint NOT NULL,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    last_activity_at timestamptz NOT NULL,
    expires_at       timestamptz
);
CREATE INDEX sandboxes_org_created ON sandboxes (org_id, created_at, id);
CREATE INDEX sandboxes_created ON sandboxes (created_at, id);
CREATE INDEX sandboxes_worker ON sandboxes (worker_id);
CREATE INDEX sandboxes_state ON sandboxes (state);
CREATE INDEX sandboxes_metadata ON sandboxes USING gin (metadata jsonb_path_ops);

CREATE TABLE operations (
    id         text PRIMARY KEY,
    org_id     text NOT NULL,
    sandbox_id text NOT NULL REFERENCES sandboxes(id),
    kind       text NOT NULL,
    state      text NOT NULL,
    target     text NOT NULL,
    reason     text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    deadline   timestamptz NOT NULL
);
CREATE INDEX operations_sandbox ON operations (sandbox_id, created_at);
CREATE INDEX operations_state ON operations (state);

CREATE TABLE idempotency_keys (
    org_id       text NOT NULL,
    key          text NOT NULL,
    sandbox_id   text NOT NULL REFERENCES sandboxes(id),
    operation_id text NOT NULL REFERENCES operations(id),
    created_at   timestamptz NOT NULL,
    PRIMARY KEY (org_id, key)
);

CREATE TABLE workers (
    id              text PRIMARY KEY,
    data_plane_url  text NOT NULL,
    internal_url    text NOT NULL,
    runtimes        jsonb NOT NULL DEFAULT 'null',
    templates       jsonb NOT NULL DEFAULT 'null',
    capacity_mib    integer NOT NULL DEFAULT 0,
    capacity_vcpus  integer NOT NULL DEFAULT 0,
    last_heartbeat  timestamptz NOT NULL,
    created_at      timestamptz NOT NULL
);

CREATE TABLE events (
    seq          bigserial PRIMARY KEY,
    org_id       text NOT NULL,
    sandbox_id   text NOT NULL DEFAULT '',
    operation_id text NOT NULL DEFAULT '',
    type         text NOT NULL,
    data         text NOT NULL DEFAULT '',
    time         timestamptz NOT NULL
);
CREATE INDEX events_org ON events (org_id, seq);
CREATE INDEX events_sandbox ON events (sandbox_id, seq);

CREATE TABLE settings (
    key   text PRIMARY KEY,
    value text NOT NULL
);
