// Package credentials turns docker config files (a pod's imagePullSecrets of type
// kubernetes.io/dockerconfigjson or kubernetes.io/dockercfg, and the node's own config.json)
// into the username and password a registry host asks for, matched as kubelet's keyring
// matches them: by host and port, with `*` globs in host labels. Credential provider plugins
// are out of scope.
package credentials

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// Keyring holds credentials in the order they are tried: the first matching entry answers.
type Keyring struct {
	entries []entry
}

type entry struct {
	host, port       string // port "" matches only a host without one
	username, secret string
}

// authConfig is one registry's entry in a docker config file.
type authConfig struct {
	Username      string `json:"username,omitempty"`
	Password      string `json:"password,omitempty"`
	Auth          string `json:"auth,omitempty"` // base64(username:password)
	IdentityToken string `json:"identitytoken,omitempty"`
}

// Parse reads a docker config.json ({"auths": {...}}) or a legacy .dockercfg ({registry:
// {...}}) and appends its entries, sorted by registry for a stable order.
func (k *Keyring) Parse(data []byte, legacy bool) error {
	var auths map[string]authConfig
	if legacy {
		if err := json.Unmarshal(data, &auths); err != nil {
			return fmt.Errorf("parse .dockercfg: %w", err)
		}
	} else {
		var cfg struct {
			Auths map[string]authConfig `json:"auths"`
		}
		if err := json.Unmarshal(data, &cfg); err != nil {
			return fmt.Errorf("parse docker config.json: %w", err)
		}
		auths = cfg.Auths
	}
	keys := make([]string, 0, len(auths))
	for key := range auths {
		keys = append(keys, key)
	}
	// More specific first, as kubelet's keyring sorts: a longer key wins.
	sortBySpecificity(keys)
	for _, key := range keys {
		a := auths[key]
		user, secret := a.Username, a.Password
		if a.Auth != "" {
			dec, err := base64.StdEncoding.DecodeString(a.Auth)
			if err != nil {
				return fmt.Errorf("registry %q: auth is not base64: %w", key, err)
			}
			u, p, ok := strings.Cut(string(dec), ":")
			if !ok {
				return fmt.Errorf("registry %q: auth is not username:password", key)
			}
			user, secret = u, p
		}
		if a.IdentityToken != "" {
			// containerd's authorizer takes an identity token as a secret with no username.
			user, secret = "", a.IdentityToken
		}
		host, port := splitKey(key)
		k.entries = append(k.entries, entry{host: host, port: port, username: user, secret: secret})
	}
	return nil
}

// AddSecret adds an image pull Secret of type kubernetes.io/dockerconfigjson or
// kubernetes.io/dockercfg; any other type is an error, as kubelet ignores it.
func (k *Keyring) AddSecret(s *v1.Secret) error {
	switch s.Type {
	case v1.SecretTypeDockerConfigJson:
		return k.Parse(s.Data[v1.DockerConfigJsonKey], false)
	case v1.SecretTypeDockercfg:
		return k.Parse(s.Data[v1.DockerConfigKey], true)
	default:
		return fmt.Errorf("secret %s/%s is of type %q, not %s or %s", s.Namespace, s.Name, s.Type, v1.SecretTypeDockerConfigJson, v1.SecretTypeDockercfg)
	}
}

// AddFile adds a docker config.json file (the node's registry credentials).
func (k *Keyring) AddFile(p string) error {
	b, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("read registry credentials: %w", err)
	}
	if err := k.Parse(b, false); err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	return nil
}

// Lookup returns the credentials for a registry host ("host" or "host:port", as a pull
// reaches it); ok is false when no entry matches.
func (k *Keyring) Lookup(hostport string) (username, secret string, ok bool) {
	if k == nil {
		return "", "", false
	}
	host, port := splitHostPort(hostport)
	host = canonicalHost(host)
	for _, e := range k.entries {
		if e.port == port && hostMatches(e.host, host) {
			return e.username, e.secret, true
		}
	}
	return "", "", false
}

// splitKey reduces a config key ("https://index.docker.io/v1/", "registry:5000/team",
// "*.example.com") to its host and port: the registry host a pull asks credentials for has
// no path, so the path part of a key is not matched.
func splitKey(key string) (host, port string) {
	key = strings.TrimPrefix(strings.TrimPrefix(key, "https://"), "http://")
	key, _, _ = strings.Cut(key, "/")
	host, port = splitHostPort(key)
	return canonicalHost(host), port
}

func splitHostPort(s string) (host, port string) {
	if h, p, err := net.SplitHostPort(s); err == nil {
		return strings.ToLower(h), p
	}
	return strings.ToLower(s), ""
}

// canonicalHost names Docker Hub one way: its keys say index.docker.io or docker.io, its
// pulls go to registry-1.docker.io.
func canonicalHost(h string) string {
	switch h {
	case "docker.io", "index.docker.io", "registry-1.docker.io":
		return "docker.io"
	}
	return h
}

// hostMatches matches host label by label against pattern, whose labels may be globs.
func hostMatches(pattern, host string) bool {
	pl, hl := strings.Split(pattern, "."), strings.Split(host, ".")
	if len(pl) != len(hl) {
		return false
	}
	for i := range pl {
		if ok, err := path.Match(pl[i], hl[i]); err != nil || !ok {
			return false
		}
	}
	return true
}

// sortBySpecificity orders keys longest first, then lexically, so that a key naming a host
// exactly is tried before a glob covering it.
func sortBySpecificity(keys []string) {
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && less(keys[j], keys[j-1]); j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
}

func less(a, b string) bool {
	if len(a) != len(b) {
		return len(a) > len(b)
	}
	return a < b
}
