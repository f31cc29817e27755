-- Checkpoints, rollback, fork and import (issue "Lifecycle", feature gate
-- "snapshots"): a sandbox's checkpoints, the task its worker runs and the
-- snapshot a fork or an import starts from, as one JSON object
-- (store.SandboxSnapshots).

ALTER TABLE sandboxes ADD COLUMN snapshots TEXT NOT NULL DEFAULT '{}';
