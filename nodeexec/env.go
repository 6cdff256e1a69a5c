package nodeexec

import (
	"fmt"
	"strings"
)

// Environment variables every driver gives an instance, and the two
// markers by which a driver finds its instances again after a crash.
const (
	EnvInstance     = "KEEL_INSTANCE"
	EnvNode         = "KEEL_NODE"
	EnvAddress      = "KEEL_ADDRESS"
	EnvService      = "KEEL_SERVICE"
	EnvVolumePrefix = "KEEL_VOLUME_"
	EnvDriverRoot   = "KEEL_DRIVER_ROOT"
	EnvSpecHash     = "KEEL_SPEC_HASH"
)

// InstanceEnv is the environment of an instance, without PATH: HOME, the
// spec's env (whose KEEL_ names are ignored: those are the agent's), and
// the KEEL_ variables, including KEEL_VOLUME_<NAME> for each volume's host
// path and the discovery markers (driverRoot, the spec hash).
func InstanceEnv(spec InstanceSpec, home, driverRoot string) (map[string]string, error) {
	env := map[string]string{"HOME": home}
	for k, v := range spec.Spec.Env {
		if !strings.HasPrefix(k, "KEEL_") {
			env[k] = v
		}
	}
	addr := ""
	if spec.Address.IsValid() {
		addr = spec.Address.String()
	}
	env[EnvInstance] = spec.Name
	env[EnvNode] = spec.Node
	env[EnvAddress] = addr
	env[EnvService] = spec.Service
	for _, v := range spec.Spec.Volumes {
		path, ok := spec.Volumes[v.Name]
		if !ok {
			return nil, fmt.Errorf("volume %s has no host path (EnsureVolume it first)", v.Name)
		}
		env[VolumeVar(spec, v.Name)] = path
	}
	env[EnvDriverRoot] = driverRoot
	env[EnvSpecHash] = spec.SpecHash
	return env, nil
}

// VolumeVar names the variable that holds a volume's host path: the volume
// name as the spec wrote it (a replica's db-0-data is KEEL_VOLUME_DATA),
// upper-cased, '-' becoming '_'.
func VolumeVar(spec InstanceSpec, volume string) string {
	if spec.Service != "" {
		volume = strings.TrimPrefix(volume, spec.Name+"-")
	}
	return EnvVolumePrefix + strings.ToUpper(strings.ReplaceAll(volume, "-", "_"))
}
