-- Drain (issue "Scale-out"): a draining worker is cordoned and its running
-- sandboxes are moved off it (suspended, then woken on another worker
-- through the blob store); sandboxes.move_from names the worker a sandbox
-- is being moved off ('' none).

ALTER TABLE workers ADD COLUMN draining boolean NOT NULL DEFAULT false;
ALTER TABLE sandboxes ADD COLUMN move_from text NOT NULL DEFAULT '';
