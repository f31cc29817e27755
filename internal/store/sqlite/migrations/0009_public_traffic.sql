-- Sandbox-port authentication (issue "Hardening", defect 2): requests to a
-- sandbox's ports (other than envd's) need its traffic token unless the
-- sandbox was created with public traffic. Existing sandboxes become
-- private: their ports now need the token.

ALTER TABLE sandboxes ADD COLUMN public_traffic INTEGER NOT NULL DEFAULT 0;
