-- Templates are first-class (issue "Templates"): the server keeps each
-- template's config (the command defaults of an imported image, as its
-- workers report it) and the deletions operators asked for. A deletion is
-- desired state, by content digest: workers that hold a copy imported
-- before deleted_at remove it; a copy imported after it is a new import
-- and clears the row.

ALTER TABLE templates ADD COLUMN config TEXT NOT NULL DEFAULT '';

CREATE TABLE template_deletions (
    digest     TEXT PRIMARY KEY,
    deleted_at TEXT NOT NULL
);
