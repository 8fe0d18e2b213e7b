-- Pausing a project (docs/flow-control.md): claims skip its runs while paused; nothing else changes.
ALTER TABLE awooop_project_flow
    ADD COLUMN paused     BOOLEAN     NOT NULL DEFAULT false,
    ADD COLUMN paused_at  TIMESTAMPTZ;
