-- Leases (issue "Scale-out"): the controller's leadership among server
-- replicas on one database. A row names its holder, until when it holds it
-- and an epoch that grows with every change of holder (a fencing token).

CREATE TABLE leases (
    name        TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,
    epoch       INTEGER NOT NULL,
    expires_at  TEXT NOT NULL
);
