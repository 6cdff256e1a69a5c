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

// ExpandArgs replaces, in each argument, ${NAME} and $NAME by the value of
// NAME in env ("" when unset) and $$ by $. Anything else that follows a $
// ($1, $?, ${x:-y}, a $ at the end) is kept as written, so that a shell
// given the argument still sees its own syntax. args is not modified.
func ExpandArgs(args []string, env map[string]string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = expand(a, env)
	}
	return out
}

func expand(s string, env map[string]string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch c := s[i+1]; {
		case c == '$':
			b.WriteByte('$')
			i++
		case c == '{':
			end := strings.IndexByte(s[i+2:], '}')
			if end < 0 || !isName(s[i+2:i+2+end]) {
				b.WriteByte('$')
				continue
			}
			b.WriteString(env[s[i+2:i+2+end]])
			i += 2 + end
		case isNameStart(c):
			j := i + 2
			for j < len(s) && (isNameStart(s[j]) || '0' <= s[j] && s[j] <= '9') {
				j++
			}
			b.WriteString(env[s[i+1:j]])
			i = j - 1
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

func isNameStart(c byte) bool {
	return c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

func isName(s string) bool {
	if s == "" || !isNameStart(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if !isNameStart(s[i]) && (s[i] < '0' || s[i] > '9') {
			return false
		}
	}
	return true
}
