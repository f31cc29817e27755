-- Egress (issue "Egress"): each sandbox's network policy (JSON of
-- model.SandboxNetwork; '' in older rows: the worker's default), each
-- org's network settings (JSON of model.OrgNetwork) and the operators'
-- named profiles.

ALTER TABLE sandboxes ADD COLUMN network text NOT NULL DEFAULT '';
ALTER TABLE orgs ADD COLUMN network jsonb NOT NULL DEFAULT '{}';

CREATE TABLE network_profiles (
    name        text PRIMARY KEY,
    description text NOT NULL DEFAULT '',
    policy      jsonb NOT NULL,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);
