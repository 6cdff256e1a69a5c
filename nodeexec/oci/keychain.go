package oci

import (
	"bytes"
	"fmt"

	"github.com/docker/cli/cli/config"
	"github.com/docker/cli/cli/config/configfile"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
)

// dockerHubKey is the key Docker's config file keeps Docker Hub's
// credentials under, for historical reasons.
const dockerHubKey = "https://" + name.DefaultRegistry + "/v1/"

// KeychainFromConfig returns the credentials of a Docker-style config
// file (config.json: "auths", and "credHelpers" or "credsStore", which run
// docker-credential-<helper> from PATH), read by the caller from a
// node-local file: registry credentials never come from the repository.
// A registry the file does not name is spoken to anonymously.
func KeychainFromConfig(data []byte) (authn.Keychain, error) {
	cf, err := config.LoadFromReader(bytes.NewReader(data))
	if err != nil {
		// The error may quote the file; it never names a secret of it
		// on its own, but keep only its gist.
		return nil, fmt.Errorf("registry config: not a Docker config file (want {\"auths\": {\"<registry>\": {\"auth\": \"<base64 user:password>\"}}})")
	}
	return fileKeychain{cf}, nil
}

type fileKeychain struct{ cf *configfile.ConfigFile }

func (k fileKeychain) Resolve(target authn.Resource) (authn.Authenticator, error) {
	key := target.RegistryStr()
	if key == name.DefaultRegistry {
		key = dockerHubKey
	}
	ac, err := k.cf.GetAuthConfig(key)
	if err != nil {
		return nil, fmt.Errorf("registry credentials for %s: %w", target.RegistryStr(), err)
	}
	cfg := authn.AuthConfig{
		Username:      ac.Username,
		Password:      ac.Password,
		Auth:          ac.Auth,
		IdentityToken: ac.IdentityToken,
		RegistryToken: ac.RegistryToken,
	}
	if cfg == (authn.AuthConfig{}) {
		return authn.Anonymous, nil
	}
	return authn.FromConfig(cfg), nil
}
