-- Traces (docs/operations.md "Traces"): an operation keeps the W3C
-- traceparent of the request that made it, so that the controller's and
-- the worker's spans for it, later and elsewhere, join that request's
-- trace ('' when tracing was off).

ALTER TABLE operations ADD COLUMN trace_parent TEXT NOT NULL DEFAULT '';
