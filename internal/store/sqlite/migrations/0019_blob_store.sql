-- The shared blob store (issue "Scale-out"): a suspended sandbox whose
-- snapshot is in it (snapshot_shared) may wake on another worker that uses
-- the same store (workers.blob_store: its URL without credentials, '' for
-- none).

ALTER TABLE sandboxes ADD COLUMN snapshot_shared INTEGER NOT NULL DEFAULT 0;
ALTER TABLE workers ADD COLUMN blob_store TEXT NOT NULL DEFAULT '';
