-- Template builds (issue "Templates"): the files users upload for COPY
-- steps (per org, content-addressed by the key they were uploaded under,
-- stored in chunks so that no statement carries a whole archive), the
-- builds themselves and each build's progress events.

CREATE TABLE build_files (
    org_id     TEXT NOT NULL REFERENCES orgs(id),
    file_key   TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    sha256     TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (org_id, file_key)
);

CREATE TABLE build_file_chunks (
    org_id TEXT NOT NULL,
    file_key TEXT NOT NULL,
    n      INTEGER NOT NULL,
    data   BLOB NOT NULL,
    PRIMARY KEY (org_id, file_key, n),
    FOREIGN KEY (org_id, file_key) REFERENCES build_files(org_id, file_key) ON DELETE CASCADE
);

CREATE TABLE builds (
    id          TEXT PRIMARY KEY,
    org_id      TEXT NOT NULL REFERENCES orgs(id),
    state       TEXT NOT NULL,
    spec        TEXT NOT NULL,
    worker      TEXT NOT NULL DEFAULT '',
    digest      TEXT NOT NULL DEFAULT '',
    error       TEXT NOT NULL DEFAULT '',
    steps       TEXT NOT NULL DEFAULT '',
    created_at  TEXT NOT NULL,
    finished_at TEXT
);

CREATE INDEX builds_org_created ON builds (org_id, created_at);

CREATE TABLE build_events (
    build_id TEXT NOT NULL REFERENCES builds(id) ON DELETE CASCADE,
    seq      INTEGER NOT NULL,
    event    TEXT NOT NULL,
    PRIMARY KEY (build_id, seq)
);
