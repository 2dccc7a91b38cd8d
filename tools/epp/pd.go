// Prefill/decode disaggregation for the Inference Extension's endpoint
// picker, as llm-d's scheduler does it (llm-d-router,
// pkg/epp/framework/plugins/scheduling/profilehandler/disagg and
// filter/bylabel). llm-d-router itself cannot be fetched here (the Go
// module proxy refuses github.com/llm-d/*), so these plugins are written
// here after its documented behaviour; the framework around them (ext_proc
// server, TLS, InferencePool reconciler, metrics scraping, scorers, picker)
// is GIE v1.5.0's own, unmodified.
//
// What is reproduced:
//   - the role filters on `llm-d.ai/role`: prefill takes `prefill`,
//     `encode-prefill`, `prefill-decode`, `both`, `encode-prefill-decode`;
//     decode takes `decode`, the three both-phase roles and pods without
//     the label (bylabel/roles.go);
//   - the profile handler: the decode profile first, then the prefill
//     profile; the decode profile is the primary one, so its pod is the
//     destination (x-gateway-destination-endpoint); a failed decode
//     profile fails the request (pd_profile_handler.go);
//   - the prefill header: the first pod of the prefill profile's result as
//     `x-prefiller-host-port: <ip:port>`, a client's copy removed first
//     (disagg_headers_handler.go, pkg/common/routing).
//
// What is not: the deciders other than "always disaggregate" (llm-d's
// default, prefix-based, needs its tokenizer), data parallelism
// (primaryPort), encode disaggregation, tracing and the decision metric.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"

	"sigs.k8s.io/controller-runtime/pkg/log"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
)

const (
	// The plugin types, as llm-d names them.
	pdProfileHandlerType     = "pd-profile-handler"
	prefillHeaderHandlerType = "prefill-header-handler"
	prefillFilterType        = "prefill-filter"
	decodeFilterType         = "decode-filter"

	// llm-d's pod label for a pod's phase(s).
	roleLabel = "llm-d.ai/role"
	// The header naming the prefill pod (llm-d-router pkg/common/routing).
	prefillerHeader = "x-prefiller-host-port"
)

func registerPD() {
	plugin.Register(pdProfileHandlerType, pdProfileHandlerFactory)
	plugin.Register(prefillHeaderHandlerType, prefillHeaderHandlerFactory)
	plugin.Register(prefillFilterType, func(name string, _ json.RawMessage, _ plugin.Handle) (plugin.Plugin, error) {
		return newRoleFilter(prefillFilterType, name, false,
			"prefill", "encode-prefill", "prefill-decode", "both", "encode-prefill-decode"), nil
	})
	plugin.Register(decodeFilterType, func(name string, _ json.RawMessage, _ plugin.Handle) (plugin.Plugin, error) {
		return newRoleFilter(decodeFilterType, name, true,
			"decode", "prefill-decode", "both", "encode-prefill-decode"), nil
	})
}

// profiles names the two scheduling profiles.
type profiles struct {
	DecodeProfile  string `json:"decodeProfile"`
	PrefillProfile string `json:"prefillProfile"`
}

func parseProfiles(raw json.RawMessage, kind string) (profiles, error) {
	p := profiles{DecodeProfile: "decode", PrefillProfile: "prefill"}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &p); err != nil {
			return p, fmt.Errorf("the parameters of %q: %w", kind, err)
		}
	}
	return p, nil
}

// roleFilter keeps the endpoints whose role label is one of roles (or,
// when unlabelledOK, that have none).
type roleFilter struct {
	name         plugin.TypedName
	roles        map[string]bool
	unlabelledOK bool
}

var _ scheduling.Filter = &roleFilter{}

func newRoleFilter(kind, name string, unlabelledOK bool, roles ...string) *roleFilter {
	set := map[string]bool{}
	for _, r := range roles {
		set[r] = true
	}
	return &roleFilter{name: plugin.TypedName{Type: kind, Name: name}, roles: set, unlabelledOK: unlabelledOK}
}

func (f *roleFilter) TypedName() plugin.TypedName { return f.name }

func (f *roleFilter) Filter(_ context.Context, _ *scheduling.CycleState, _ *scheduling.LLMRequest,
	endpoints []scheduling.Endpoint) []scheduling.Endpoint {
	kept := []scheduling.Endpoint{}
	for _, e := range endpoints {
		role, labelled := e.GetMetadata().Labels[roleLabel]
		if f.roles[role] || (!labelled && f.unlabelledOK) {
			kept = append(kept, e)
		}
	}
	return kept
}

// pdProfileHandler runs the decode profile, then the prefill profile: every
// request is split (llm-d's always-disaggregate decider).
type pdProfileHandler struct {
	name plugin.TypedName
	profiles
}

var _ scheduling.ProfileHandler = &pdProfileHandler{}

func pdProfileHandlerFactory(name string, raw json.RawMessage, _ plugin.Handle) (plugin.Plugin, error) {
	p, err := parseProfiles(raw, pdProfileHandlerType)
	if err != nil {
		return nil, err
	}
	return &pdProfileHandler{name: plugin.TypedName{Type: pdProfileHandlerType, Name: name}, profiles: p}, nil
}

func (h *pdProfileHandler) TypedName() plugin.TypedName { return h.name }

func (h *pdProfileHandler) Pick(_ context.Context, _ *scheduling.CycleState, _ *scheduling.LLMRequest,
	all map[string]scheduling.SchedulerProfile, results map[string]*scheduling.ProfileRunResult) map[string]scheduling.SchedulerProfile {
	decode, ran := results[h.DecodeProfile]
	if !ran {
		return map[string]scheduling.SchedulerProfile{h.DecodeProfile: all[h.DecodeProfile]}
	}
	// A decode profile that found no pod ends the cycle (the request fails).
	if decode == nil || len(results) == len(all) {
		return map[string]scheduling.SchedulerProfile{}
	}
	return map[string]scheduling.SchedulerProfile{h.PrefillProfile: all[h.PrefillProfile]}
}

func (h *pdProfileHandler) ProcessResults(_ context.Context, _ *scheduling.CycleState, _ *scheduling.LLMRequest,
	results map[string]*scheduling.ProfileRunResult) (*scheduling.SchedulingResult, error) {
	decode := results[h.DecodeProfile]
	if decode == nil {
		return nil, errors.New("no decode pod available")
	}
	kept := map[string]*scheduling.ProfileRunResult{h.DecodeProfile: decode}
	if prefill := results[h.PrefillProfile]; prefill != nil {
		kept[h.PrefillProfile] = prefill
	}
	return &scheduling.SchedulingResult{PrimaryProfileName: h.DecodeProfile, ProfileResults: kept}, nil
}

// prefillHeaderHandler names the prefill profile's pod in
// x-prefiller-host-port, and logs the pick (both pods) at info level.
type prefillHeaderHandler struct {
	name plugin.TypedName
	profiles
}

var _ requestcontrol.PreRequest = &prefillHeaderHandler{}

func prefillHeaderHandlerFactory(name string, raw json.RawMessage, _ plugin.Handle) (plugin.Plugin, error) {
	p, err := parseProfiles(raw, prefillHeaderHandlerType)
	if err != nil {
		return nil, err
	}
	return &prefillHeaderHandler{name: plugin.TypedName{Type: prefillHeaderHandlerType, Name: name}, profiles: p}, nil
}

func (p *prefillHeaderHandler) TypedName() plugin.TypedName { return p.name }

func first(r *scheduling.ProfileRunResult) string {
	if r == nil || len(r.TargetEndpoints) == 0 {
		return ""
	}
	m := r.TargetEndpoints[0].GetMetadata()
	return net.JoinHostPort(m.GetIPAddress(), m.GetPort())
}

func (p *prefillHeaderHandler) PreRequest(ctx context.Context, request *scheduling.LLMRequest, result *scheduling.SchedulingResult) {
	if request == nil || result == nil {
		return
	}
	delete(request.Headers, prefillerHeader)
	prefill := first(result.ProfileResults[p.PrefillProfile])
	if prefill != "" {
		request.Headers[prefillerHeader] = prefill
	}
	log.FromContext(ctx).Info("pd pick", "requestId", request.RequestId,
		"decode", first(result.ProfileResults[p.DecodeProfile]), "prefill", prefill)
}
