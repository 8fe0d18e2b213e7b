-- ListRuns by parent (issue 28; `awooop runs list --parent`): a parent's children in ListRuns'
-- page order, (created_at DESC, run_id), so a page of a parent's children is an index range that
-- starts at the cursor, as a page of a project's runs is on awooop_run_list_idx. (0190's
-- awooop_run_parent_idx orders them by child_seq, the cascades' and the saga's order: a page would
-- read and sort every child of the parent, up to AWOOOP_MAX_CHILDREN_PER_RUN.) Partial: runs
-- without a parent cost nothing; none of its columns is ever updated, so updates stay HOT.
CREATE INDEX awooop_run_children_list_idx ON awooop_run_state (parent_run_id, created_at DESC, run_id)
    WHERE parent_run_id IS NOT NULL;
