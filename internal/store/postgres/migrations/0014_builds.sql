-- Template builds (issue "Templates"): the files users upload for COPY
-- steps (per org, content-addressed by the key they were uploaded under,
-- stored in chunks so that no statement carries a whole archive), the
-- builds themselves and each build's progress events.

CREATE TABLE build_files (
    org_id     text NOT NULL REFERENCES orgs(id),
    file_key   text NOT NULL,
    size_bytes bigint NOT NULL,
    sha256     text NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (org_id, file_key)
);

CREATE TABLE build_file_chunks (
    org_id text NOT NULL,
    file_key text NOT NULL,
    n      bigint NOT NULL,
    data   bytea NOT NULL,
    PRIMARY KEY (org_id, file_key, n),
    FOREIGN KEY (org_id, file_key) REFERENCES build_files(org_id, file_key) ON DELETE CASCADE
);

CREATE TABLE builds (
    id          text PRIMARY KEY,
    org_id      text NOT NULL REFERENCES orgs(id),
    state       text NOT NULL,
    spec        text NOT NULL,
    worker      text NOT NULL DEFAULT '',
    digest      text NOT NULL DEFAULT '',
    error       text NOT NULL DEFAULT '',
    steps       text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL,
    finished_at timestamptz
);

CREATE INDEX builds_org_created ON builds (org_id, created_at);

CREATE TABLE build_events (
    build_id text NOT NULL REFERENCES builds(id) ON DELETE CASCADE,
    seq      bigint NOT NULL,
    event    text NOT NULL,
    PRIMARY KEY (build_id, seq)
);
