-- Credentials (issue "Hardening", defect 7): API keys expire and can be
-- revoked (the row stays so that a refused key can be named), and every
-- worker has its own secret, bound to its id, that it received at its first
-- registration in exchange for the join token.

ALTER TABLE api_keys ADD COLUMN expires_at TEXT;
ALTER TABLE api_keys ADD COLUMN revoked_at TEXT;
CREATE INDEX api_keys_org ON api_keys (org_id, created_at, id);

CREATE TABLE worker_credentials (
    worker_id   TEXT PRIMARY KEY,
    secret_hash TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL
);
