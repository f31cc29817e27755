-- Per-org quotas (JSON of model.Quotas; '{}' is unlimited).
ALTER TABLE orgs ADD COLUMN quotas jsonb NOT NULL DEFAULT '{}';
