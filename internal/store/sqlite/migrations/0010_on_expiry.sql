-- Expiry moves into the controller (issue "Architecture", item 3): what
-- happens at expires_at is a column, not an E2B metadata key. Sandboxes
-- created through E2B with autoPause (metadata airlock.e2b.on_timeout =
-- pause) are suspended at expiry; every other one is deleted ('' means
-- delete).

ALTER TABLE sandboxes ADD COLUMN on_expiry TEXT NOT NULL DEFAULT '';
UPDATE sandboxes SET on_expiry = 'suspend'
    WHERE json_valid(metadata) AND json_extract(metadata, '$."airlock.e2b.on_timeout"') = 'pause';
