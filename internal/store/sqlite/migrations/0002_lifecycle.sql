-- Lifecycle: idle auto-suspend, auto-wake opt-out, snapshots, warm pools,
-- per-org feature gates and idle settings.
-- Sandboxes created before this migration get idle_suspend_s 0 (disabled).

ALTER TABLE sandboxes ADD COLUMN idle_suspend_s INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN no_auto_wake INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN snapshot_id TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN snapshot_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN pool TEXT NOT NULL DEFAULT '';
CREATE INDEX sandboxes_pool ON sandboxes (pool);

ALTER TABLE orgs ADD COLUMN features TEXT NOT NULL DEFAULT 'null';
ALTER TABLE orgs ADD COLUMN idle_suspend_s INTEGER;
