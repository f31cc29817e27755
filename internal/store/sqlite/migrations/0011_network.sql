-- Egress (issue "Egress"): each sandbox's network policy (JSON of
-- model.SandboxNetwork; '' in older rows: the worker's default), each
-- org's network settings (JSON of model.OrgNetwork) and the operators'
-- named profiles.

ALTER TABLE sandboxes ADD COLUMN network TEXT NOT NULL DEFAULT '';
ALTER TABLE orgs ADD COLUMN network TEXT NOT NULL DEFAULT '{}';

CREATE TABLE network_profiles (
    name        TEXT PRIMARY KEY,
    description TEXT NOT NULL DEFAULT '',
    policy      TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL
);
