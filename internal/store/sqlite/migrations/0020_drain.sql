-- Drain (issue "Scale-out"): a draining worker is cordoned and its running
-- sandboxes are moved off it (suspended, then woken on another worker
-- through the blob store); sandboxes.move_from names the worker a sandbox
-- is being moved off ('' none).

ALTER TABLE workers ADD COLUMN draining INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN move_from TEXT NOT NULL DEFAULT '';
