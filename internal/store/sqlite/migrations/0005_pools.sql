-- Warm pools (issue "Lifecycle"): per template digest, how many ready
-- sandboxes to keep and with which resources.

CREATE TABLE pools (
    digest     TEXT PRIMARY KEY,
    template   TEXT NOT NULL,
    size       INTEGER NOT NULL,
    resources  TEXT NOT NULL DEFAULT '{}',
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
