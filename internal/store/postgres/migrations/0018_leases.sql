-- Leases (issue "Scale-out"): the controller's leadership among server
-- replicas on one database. A row names its holder, until when it holds it
-- and an epoch that grows with every change of holder (a fencing token).

CREATE TABLE leases (
    name        text PRIMARY KEY,
    holder      text NOT NULL,
    epoch       bigint NOT NULL,
    expires_at  timestamptz NOT NULL
);
