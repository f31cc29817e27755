-- Capacity that matches reality (issue "Performance"): a worker reports
-- the memory its host has free for sandboxes at every sync, and placement
-- checks a new sandbox's start against it as well as against the
-- overcommitted reservations (NULL: never reported).

ALTER TABLE workers ADD COLUMN free_mib INTEGER;
