-- Secrets (issue "Egress"): per-org named values the egress gateway
-- injects into intercepted requests (NetworkPolicyV1 "inject"). Values
-- are write-only through the API; they leave the server only in the sync
-- response of the worker hosting a sandbox whose policy names them.

CREATE TABLE secrets (
    org_id     text NOT NULL REFERENCES orgs(id),
    name       text NOT NULL,
    value      text NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (org_id, name)
);
