package credentials

import (
	"encoding/base64"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func TestKeyringLookup(t *testing.T) {
	auth := base64.StdEncoding.EncodeToString([]byte("bob:hunter2"))
	var k Keyring
	if err := k.AddSecret(&v1.Secret{Type: v1.SecretTypeDockerConfigJson, Data: map[string][]byte{
		v1.DockerConfigJsonKey: []byte(`{"auths": {
			"registry.local:5000": {"username": "gw", "password": "pw"},
			"*.example.com": {"auth": "` + auth + `"},
			"https://index.docker.io/v1/": {"username": "hub", "password": "hubpw"},
			"tokens.example.com": {"identitytoken": "tok"}
		}}`),
	}}); err != nil {
		t.Fatal(err)
	}
	if err := k.AddSecret(&v1.Secret{Type: v1.SecretTypeDockercfg, Data: map[string][]byte{
		v1.DockerConfigKey: []byte(`{"legacy.local": {"username": "old", "password": "oldpw"}}`),
	}}); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		host, user, secret string
		ok                 bool
	}{
		{"registry.local:5000", "gw", "pw", true},
		{"registry.local", "", "", false},      // another port
		{"registry.local:5001", "", "", false}, // another port
		{"eu.example.com", "bob", "hunter2", true},
		{"a.b.example.com", "", "", false}, // a glob covers one label
		{"tokens.example.com", "", "tok", true},
		{"registry-1.docker.io", "hub", "hubpw", true},
		{"legacy.local", "old", "oldpw", true},
		{"other.local", "", "", false},
	} {
		u, s, ok := k.Lookup(tt.host)
		if u != tt.user || s != tt.secret || ok != tt.ok {
			t.Errorf("Lookup(%q) = %q, %q, %v; want %q, %q, %v", tt.host, u, s, ok, tt.user, tt.secret, tt.ok)
		}
	}
	if err := k.AddSecret(&v1.Secret{Type: v1.SecretTypeOpaque}); err == nil {
		t.Error("an Opaque secret was taken as a pull secret")
	}
}
