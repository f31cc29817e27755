-- Warm pools (issue "Lifecycle"): per template digest, how many ready
-- sandboxes to keep and with which resources.

CREATE TABLE pools (
    digest     text PRIMARY KEY,
    template   text NOT NULL,
    size       integer NOT NULL,
    resources  jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);
