-- Argo CD health of an Application, as its parent (root.yaml, an app of apps) sees it, so
-- that a sync wave waits for the one before (Lua 5.1). Argo CD's own recipe passes
-- status.health through; that alone let the configuration's wave start while the
-- controller's pods were still starting: a new Application reads Healthy for a moment
-- after its first comparison, before its sync has created anything. So an Application is
-- Healthy here only when its sync has also finished and it is Synced.
local hs = {status = "Progressing", message = "Waiting for the Application's first comparison"}
if obj.status == nil or obj.status.health == nil then
  return hs
end
hs.status = obj.status.health.status
hs.message = obj.status.health.message or ""
if hs.status ~= "Healthy" then
  return hs
end
local op = obj.status.operationState
if obj.operation ~= nil or (op ~= nil and op.phase == "Running") then
  hs.status = "Progressing"
  hs.message = "Waiting for the sync in progress to finish"
elseif obj.status.sync == nil or obj.status.sync.status ~= "Synced" then
  hs.status = "Progressing"
  hs.message = "Waiting for the Application to be Synced"
end
return hs
