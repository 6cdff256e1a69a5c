package render

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"slices"
)

// ChangeClass says what a change to a field does to a running instance (the
// table "What a change does" in docs/spec.md).
type ChangeClass string

const (
	// ChangeReplace destroys the jail and creates it again, with the same
	// name, node and address; volumes are kept.
	ChangeReplace ChangeClass = "replace"
	// ChangeRestart restarts the jail's command.
	ChangeRestart ChangeClass = "restart"
	// ChangeLive is applied to the running jail without a restart.
	ChangeLive ChangeClass = "live"
	// ChangeProxy changes only the Service proxies.
	ChangeProxy ChangeClass = "proxy"
	// ChangeScale adds or removes replicas.
	ChangeScale ChangeClass = "scale"
	// ChangeMove moves a stateless instance to a node that matches.
	ChangeMove ChangeClass = "move"
)

// FieldChange is one field that differs between two renderings of an
// instance, with what changing it does.
type FieldChange struct {
	Field string      `json:"field"`
	Class ChangeClass `json:"class"`
}

// The parts of a spec that each class of change covers. A specHash is the
// concatenation of one hash per part, so that comparing two hashes tells
// which class of change separates them without the old spec at hand.
type replacePart struct {
	Image   string   `json:"image"`
	VNet    bool     `json:"vnet"`
	Bridge  string   `json:"bridge"`
	Address string   `json:"address"`
	Volumes []Volume `json:"volumes"`
}

type restartPart struct {
	Command []string          `json:"command"`
	Env     map[string]string `json:"env"`
}

type livePart struct {
	Resources     Resources `json:"resources"`
	RestartPolicy string    `json:"restartPolicy"`
}

func parts(s JailSpec) (any, any, any) {
	addr := ""
	if s.Network.Address.IsValid() {
		addr = s.Network.Address.String()
	}
	return replacePart{Image: s.Image, VNet: s.Network.VNet, Bridge: s.Network.Bridge, Address: addr, Volumes: s.Volumes},
		restartPart{Command: s.Command, Env: s.Env},
		livePart{Resources: s.Resources, RestartPolicy: s.RestartPolicy}
}

// hashLen is the number of hex digits of each part of a specHash.
const hashLen = 16

func partHash(v any) string {
	b, err := json.Marshal(v) // maps are written with sorted keys
	if err != nil {
		panic(err) // only plain data types: cannot fail
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:hashLen/2])
}

// SpecHash returns the stable hash of a rendered spec: 48 hex digits, the
// first 16 covering what a replace changes (image, network, volumes), the
// next 16 what a restart changes (command, env), the last 16 what is applied
// live (resources, restartPolicy).
func SpecHash(s JailSpec) string {
	a, b, c := parts(s)
	return partHash(a) + partHash(b) + partHash(c)
}

// ClassifyHashChange returns the most disruptive class of change between
// two specHashes ("" when they are equal). A hash that is not a specHash
// (an older agent's, say) counts as a replace.
func ClassifyHashChange(from, to string) ChangeClass {
	switch {
	case from == to:
		return ""
	case len(from) != 3*hashLen || len(to) != 3*hashLen || from[:hashLen] != to[:hashLen]:
		return ChangeReplace
	case from[hashLen:2*hashLen] != to[hashLen:2*hashLen]:
		return ChangeRestart
	default:
		return ChangeLive
	}
}

// CompareSpecs lists the fields that differ between two specs, each with its
// class, in a fixed order (most disruptive first).
func CompareSpecs(from, to JailSpec) []FieldChange {
	var out []FieldChange
	add := func(changed bool, field string, class ChangeClass) {
		if changed {
			out = append(out, FieldChange{Field: field, Class: class})
		}
	}
	add(from.Image != to.Image, "image", ChangeReplace)
	add(from.Network.VNet != to.Network.VNet, "network.vnet", ChangeReplace)
	add(from.Network.Bridge != to.Network.Bridge, "network.bridge", ChangeReplace)
	add(from.Network.Address != to.Network.Address, "network.address", ChangeReplace)
	add(!slices.Equal(from.Volumes, to.Volumes), "volumes", ChangeReplace)
	add(!slices.Equal(from.Command, to.Command), "command", ChangeRestart)
	add(!maps.Equal(from.Env, to.Env), "env", ChangeRestart)
	add(from.Resources != to.Resources, "resources", ChangeLive)
	add(from.RestartPolicy != to.RestartPolicy, "restartPolicy", ChangeLive)
	return out
}
