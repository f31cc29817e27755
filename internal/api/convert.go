package api

import (
	"github.com/airlock/airlock/internal/api/apitypes"
	"github.com/airlock/airlock/internal/service"
)

// The translations between /v1 wire types and the service's own types.
// Where both have the same fields a Go conversion does it, so a field added
// on one side only is a compile error here.

func createParams(req apitypes.CreateSandboxRequest) service.CreateParams {
	p := service.CreateParams{
		Template: req.Template, Runtime: req.Runtime, Resources: req.Resources,
		Env: req.Env, Metadata: req.Metadata, TimeoutS: req.TimeoutS,
		IdleSuspendAfterS: req.IdleSuspendAfterS, AutoWake: req.AutoWake, PublicTraffic: req.PublicTraffic,
		Count: req.Count, Import: req.Import,
	}
	if ref := req.FromCheckpoint; ref != nil {
		p.FromCheckpoint = &service.CheckpointRef{SandboxID: ref.SandboxID, Checkpoint: ref.Checkpoint}
	}
	if n := req.Network; n != nil {
		p.Network = &service.NetworkParams{Profile: n.Profile, Policy: n.Policy}
	}
	return p
}

func forksResponse(forks []service.Created) apitypes.CreateSandboxResponse {
	out := apitypes.CreateSandboxResponse{Sandbox: forks[0].Sandbox, Operation: forks[0].Operation}
	for _, f := range forks {
		out.Forks = append(out.Forks, apitypes.CreateSandboxResponse{Sandbox: f.Sandbox, Operation: f.Operation})
	}
	return out
}

func orgUpdate(req apitypes.UpdateOrgRequest) service.OrgUpdate {
	u := service.OrgUpdate{Features: req.Features, IdleSuspendAfterS: req.IdleSuspendAfterS, Network: req.Network}
	if req.Quotas != nil {
		q := service.QuotasPatch(*req.Quotas)
		u.Quotas = &q
	}
	return u
}

func poolsOut(pools []service.PoolStatus) []apitypes.Pool {
	out := make([]apitypes.Pool, len(pools))
	for i, p := range pools {
		out[i] = apitypes.Pool(p)
	}
	return out
}
