-- Cordoned workers (issue "Scale-out"): an operator's mark that a worker
-- takes no new sandboxes (placement skips it); what runs there stays. The
-- worker's own upserts (registration, sync) never change it.

ALTER TABLE workers ADD COLUMN cordoned INTEGER NOT NULL DEFAULT 0;
