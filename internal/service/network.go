package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/airlock/airlock/internal/model"
	"github.com/airlock/airlock/internal/netpolicy"
)

// Egress policies (docs/network.md). A sandbox's policy is resolved when
// it is set — at create, or by SetSandboxNetwork — from the request (a
// profile, or an inline NetworkPolicyV1), else its org's default profile;
// the worker's gateway enforces what the sandbox record holds. Who may
// choose what:
//
//   - an org may always choose "none", and otherwise the profiles its
//     settings list (model.OrgNetwork.Profiles; none listed: only its
//     default);
//   - inline policies need the org's InlinePolicies (the default org, the
//     installation's own, always may: E2B's allowOut and denyOut are inline
//     policies, and `airlock up` users are in it);
//   - operators (admins of the default org) define profiles, set orgs'
//     network settings, and may use any profile and inline policies.

// NetworkParams choose a sandbox's egress: a profile or an inline policy,
// or (OrgDefault) its org's default profile.
type NetworkParams struct {
	Profile    string
	Policy     json.RawMessage
	OrgDefault bool
}

var profileName = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// networkProfile returns profile name: a built-in or a stored one.
func (s *Service) networkProfile(ctx context.Context, name string) (model.NetworkProfile, error) {
	if p, ok := netpolicy.Builtin(name); ok {
		b, err := json.Marshal(p)
		return model.NetworkProfile{Name: name, Policy: b, Builtin: true, Description: builtinProfiles[name]}, err
	}
	p, err := s.st.GetNetworkProfile(ctx, name)
	if errors.Is(err, model.ErrNotFound) {
		return model.NetworkProfile{}, model.Errorf(model.ErrUnprocessable, "there is no network profile %.80q; list them with GET /v1/network-profiles", name)
	}
	return p, err
}

var builtinProfiles = map[string]string{
	netpolicy.ProfileNone:   "no egress at all",
	netpolicy.ProfilePublic: "any public address; nothing private, loopback, link-local or on the host",
}

// orgDefaultProfile is the profile org's sandboxes get without asking.
func orgDefaultProfile(org model.Org) string {
	if org.Network.Default != "" {
		return org.Network.Default
	}
	return model.DefaultNetworkProfile
}

// resolveNetwork is the network a sandbox of org gets for req (nil: the
// org's default), for principal p.
func (s *Service) resolveNetwork(ctx context.Context, p Principal, org model.Org, req *NetworkParams) (*model.SandboxNetwork, error) {
	var r NetworkParams
	if req != nil && !req.OrgDefault {
		r = *req
	}
	if r.Profile != "" && len(r.Policy) > 0 {
		return nil, model.Errorf(model.ErrUnprocessable, "network: set either profile or policy, not both")
	}
	if len(r.Policy) > 0 {
		if !p.Operator() && !org.Network.InlinePolicies && org.ID != DefaultOrgID {
			return nil, model.Errorf(model.ErrForbidden, "org %s may not send network policies of its own; choose a profile (network.profile) or ask an operator to allow inline policies", org.ID)
		}
		pol, err := netpolicy.Parse(r.Policy)
		if err != nil {
			return nil, model.Errorf(model.ErrUnprocessable, "network.policy: %v", err)
		}
		if err := netpolicy.DefaultGuard().Check(pol); err != nil {
			return nil, model.Errorf(model.ErrUnprocessable, "network.policy: %v", err)
		}
		b, err := json.Marshal(pol)
		if err != nil {
			return nil, err
		}
		return &model.SandboxNetwork{Policy: b}, nil
	}
	name := r.Profile
	if name == "" {
		name = orgDefaultProfile(org)
	} else if !p.Operator() && !profileAllowed(org, name) {
		return nil, model.Errorf(model.ErrForbidden, "org %s may not use network profile %.80q; it may use %s", org.ID, name, strings.Join(allowedProfiles(org), ", "))
	}
	prof, err := s.networkProfile(ctx, name)
	if err != nil {
		return nil, err
	}
	return &model.SandboxNetwork{Profile: name, Policy: prof.Policy}, nil
}

func allowedProfiles(org model.Org) []string {
	out := []string{orgDefaultProfile(org)}
	for _, p := range append(slices.Clone(org.Network.Profiles), netpolicy.ProfileNone) {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

func profileAllowed(org model.Org, name string) bool {
	return slices.Contains(allowedProfiles(org), name)
}

// SetSandboxNetwork replaces a sandbox's egress policy. Its worker's
// gateway applies it to new connections at once and cuts open ones the
// new policy denies.
func (s *Service) SetSandboxNetwork(ctx context.Context, p Principal, id string, req NetworkParams) (model.Sandbox, error) {
	org, err := s.st.GetOrg(ctx, p.OrgID)
	if err != nil {
		return model.Sandbox{}, fmt.Errorf("get org %s: %w", p.OrgID, err)
	}
	if req.Profile == "" && len(req.Policy) == 0 && !req.OrgDefault {
		return model.Sandbox{}, model.Errorf(model.ErrUnprocessable, "network: set profile or policy")
	}
	n, err := s.resolveNetwork(ctx, p, org, &req)
	if err != nil {
		return model.Sandbox{}, err
	}
	for range maxUpdateRetries {
		sb, err := s.GetSandbox(ctx, p, id)
		if err != nil {
			return model.Sandbox{}, err
		}
		if sb.State == model.StateDeleted || sb.DesiredState == model.StateDeleted {
			return model.Sandbox{}, model.Errorf(model.ErrNotFound, "sandbox %s not found", id)
		}
		sb.Network = n
		updated, err := s.st.UpdateSandbox(ctx, sb)
		if errors.Is(err, model.ErrConflict) {
			continue
		}
		if err != nil {
			return model.Sandbox{}, fmt.Errorf("set network of sandbox %s: %w", id, err)
		}
		s.publish(ctx, &updated, nil)
		s.kick()
		return updated, nil
	}
	return model.Sandbox{}, model.Errorf(model.ErrConflict, "sandbox %s is changing too fast to set its network; retry", id)
}

// ListNetworkProfiles lists the built-in and the operators' profiles.
func (s *Service) ListNetworkProfiles(ctx context.Context, p Principal) ([]model.NetworkProfile, error) {
	var out []model.NetworkProfile
	for _, name := range []string{netpolicy.ProfileNone, netpolicy.ProfilePublic} {
		prof, err := s.networkProfile(ctx, name)
		if err != nil {
			return nil, err
		}
		out = append(out, prof)
	}
	stored, err := s.st.ListNetworkProfiles(ctx)
	if err != nil {
		return nil, fmt.Errorf("list network profiles: %w", err)
	}
	return append(out, stored...), nil
}

// GetNetworkProfile returns one profile.
func (s *Service) GetNetworkProfile(ctx context.Context, p Principal, name string) (model.NetworkProfile, error) {
	prof, err := s.networkProfile(ctx, name)
	if errors.Is(err, model.ErrUnprocessable) { // no such profile
		return model.NetworkProfile{}, model.Errorf(model.ErrNotFound, "there is no network profile %.80q", name)
	}
	return prof, err
}

// PutNetworkProfile creates or replaces an operator profile.
func (s *Service) PutNetworkProfile(ctx context.Context, p Principal, name, description string, policy json.RawMessage) (model.NetworkProfile, error) {
	if !p.Operator() {
		return model.NetworkProfile{}, model.Errorf(model.ErrForbidden, "network profiles are set by admins of the %q org", DefaultOrgName)
	}
	if !profileName.MatchString(name) {
		return model.NetworkProfile{}, model.Errorf(model.ErrUnprocessable, "profile name %.80q: use 1-63 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit", name)
	}
	if _, ok := netpolicy.Builtin(name); ok {
		return model.NetworkProfile{}, model.Errorf(model.ErrConflict, "%q is a built-in profile; choose another name", name)
	}
	if len(description) > 512 {
		return model.NetworkProfile{}, model.Errorf(model.ErrUnprocessable, "description is %d bytes; at most 512 are allowed", len(description))
	}
	pol, err := netpolicy.Parse(policy)
	if err != nil {
		return model.NetworkProfile{}, model.Errorf(model.ErrUnprocessable, "policy: %v", err)
	}
	b, err := json.Marshal(pol)
	if err != nil {
		return model.NetworkProfile{}, err
	}
	now := s.now()
	prof := model.NetworkProfile{Name: name, Description: description, Policy: b, CreatedAt: now, UpdatedAt: now}
	if err := s.st.PutNetworkProfile(ctx, prof); err != nil {
		return model.NetworkProfile{}, fmt.Errorf("put network profile %s: %w", name, err)
	}
	return s.st.GetNetworkProfile(ctx, name)
}

// DeleteNetworkProfile removes an operator profile. Sandboxes that use it
// keep the policy they were given; orgs that name it fall back to the
// default profile when they name it no more.
func (s *Service) DeleteNetworkProfile(ctx context.Context, p Principal, name string) error {
	if !p.Operator() {
		return model.Errorf(model.ErrForbidden, "network profiles are set by admins of the %q org", DefaultOrgName)
	}
	if _, ok := netpolicy.Builtin(name); ok {
		return model.Errorf(model.ErrConflict, "%q is a built-in profile and cannot be removed", name)
	}
	orgs, err := s.st.ListOrgs(ctx)
	if err != nil {
		return err
	}
	for _, o := range orgs {
		if o.Network.Default == name {
			return model.Errorf(model.ErrConflict, "org %s uses profile %q as its default; change that first", o.ID, name)
		}
	}
	if err := s.st.DeleteNetworkProfile(ctx, name); errors.Is(err, model.ErrNotFound) {
		return model.Errorf(model.ErrNotFound, "there is no network profile %.80q", name)
	} else if err != nil {
		return err
	}
	return nil
}

// validOrgNetwork checks an org's network settings: profiles that exist.
func (s *Service) validOrgNetwork(ctx context.Context, n model.OrgNetwork) error {
	for i, name := range append(slices.Clone(n.Profiles), n.Default) {
		if name == "" && i == len(n.Profiles) {
			continue
		}
		if _, err := s.networkProfile(ctx, name); err != nil {
			return model.Errorf(model.ErrUnprocessable, "network: profile %.80q does not exist", name)
		}
	}
	return nil
}
