-- name: LockDeployment :val
-- A deployment's replicas, locked until the scaling transaction ends.
SELECT replicas FROM awooop_refgw_deployment WHERE project_id = :project_id AND name = :name FOR UPDATE

-- name: ScaleDeployment :exec
UPDATE awooop_refgw_deployment SET replicas = :replicas, updated_at = now()
 WHERE project_id = :project_id AND name = :name

-- name: CreateResource :val
-- A resource; no row when one of that kind and name exists.
INSERT INTO awooop_refgw_resource (project_id, kind, name, spec) VALUES (:project_id, :kind, :name, :spec)
ON CONFLICT DO NOTHING RETURNING true

-- name: PutDeployment :exec
-- The deployment row of a Deployment resource (replaced when one was left behind).
INSERT INTO awooop_refgw_deployment (project_id, name, replicas) VALUES (:project_id, :name, :replicas)
ON CONFLICT (project_id, name) DO UPDATE SET replicas = EXCLUDED.replicas, updated_at = now()

-- name: DeleteResource :val
-- true when it existed.
DELETE FROM awooop_refgw_resource WHERE project_id = :project_id AND kind = :kind AND name = :name RETURNING true

-- name: DeleteDeployment :exec
DELETE FROM awooop_refgw_deployment WHERE project_id = :project_id AND name = :name

-- name: InsertRow :val
INSERT INTO awooop_refgw_row (project_id, table_name, data) VALUES (:project_id, :table_name, :data) RETURNING row_id

-- name: DeleteRow :val
-- true when it existed.
DELETE FROM awooop_refgw_row
 WHERE project_id = :project_id AND table_name = :table_name AND row_id = :row_id
RETURNING true

-- name: WriteKnowledge :val
-- An entry, created or replaced; true when created (xmax = 0: the row is a fresh insert).
INSERT INTO awooop_refgw_knowledge (project_id, entry_id, content) VALUES (:project_id, :entry_id, :content)
ON CONFLICT (project_id, entry_id) DO UPDATE SET content = EXCLUDED.content
RETURNING (xmax = 0)

-- name: DeleteKnowledge :val
-- true when it existed.
DELETE FROM awooop_refgw_knowledge WHERE project_id = :project_id AND entry_id = :entry_id RETURNING true
