package containerd

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestUserSpecOptsMatchContainerd: the user options give the spec (or the refusal) pkg/oci's
// give, on a rootfs with an /etc/passwd and /etc/group, and on one without them.
func TestUserSpecOptsMatchContainerd(t *testing.T) {
	withFiles := t.TempDir()
	if err := os.MkdirAll(filepath.Join(withFiles, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n",
		"etc/group":  "root:x:0:\nwheel:x:10:root,app\napp:x:1000:app\nvideo:x:44:app\nnogroup:x:65534:\n",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(withFiles, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	empty := t.TempDir()

	cases := []struct {
		name       string
		mine, want oci.SpecOpts
	}{
		{"user name", withUser("app"), oci.WithUser("app")},
		{"user id", withUser("1000"), oci.WithUser("1000")},
		{"unknown user id", withUser("4242"), oci.WithUser("4242")},
		{"unknown user name", withUser("ghost"), oci.WithUser("ghost")},
		{"user:group", withUser("app:video"), oci.WithUser("app:video")},
		{"uid:gid", withUser("7:8"), oci.WithUser("7:8")},
		{"uid:group", withUser("1000:wheel"), oci.WithUser("1000:wheel")},
		{"user:unknown group", withUser("app:ghost"), oci.WithUser("app:ghost")},
		{"uid out of range", withUser("4294967296"), oci.WithUser("4294967296")},
		{"three parts", withUser("a:b:c"), oci.WithUser("a:b:c")},
		// An empty part is 0, not a name (USER ${UID}:${GID} with one of them unset).
		{"uid:empty", withUser("1000:"), oci.WithUser("1000:")},
		{"empty:gid", withUser(":1000"), oci.WithUser(":1000")},
		{"empty:empty", withUser(":"), oci.WithUser(":")},
		{"user:empty", withUser("app:"), oci.WithUser("app:")},
		{"empty:group", withUser(":video"), oci.WithUser(":video")},
		{"user id option", withUserID(1000), oci.WithUserID(1000)},
		{"unknown user id option", withUserID(31), oci.WithUserID(31)},
		{"username option", withUsername("nobody"), oci.WithUsername("nobody")},
		{"additional gids of uid", withAdditionalGIDs("1000"), oci.WithAdditionalGIDs("1000")},
		{"additional gids of root", withAdditionalGIDs("root"), oci.WithAdditionalGIDs("root")},
		{"additional gids of unknown uid", withAdditionalGIDs("77"), oci.WithAdditionalGIDs("77")},
		{"supplemental groups", withSupplementalGroups(5, 44, 10), oci.WithAppendAdditionalGroups("5", "44", "10")},
		{"supplemental group already there", withSupplementalGroups(3, 99), oci.WithAppendAdditionalGroups("3", "99")},
	}
	ctx := namespaces.WithNamespace(context.Background(), "holdfast")
	for _, root := range []string{withFiles, empty} {
		for _, tc := range cases {
			spec := func(opt oci.SpecOpts) (*oci.Spec, string) {
				// As the agent applies them: the image's user first, then the pod's.
				s, err := oci.GenerateSpec(ctx, nil, &containers.Container{ID: "user"}, oci.WithRootFSPath(root), withUIDGIDKeptGroups(3, 3), opt)
				if err != nil {
					return nil, err.Error()
				}
				return s, ""
			}
			got, gotErr := spec(tc.mine)
			want, wantErr := spec(tc.want)
			if gotErr != wantErr || !reflect.DeepEqual(got, want) {
				t.Errorf("%s on %s: got %+v %q, containerd's %+v %q", tc.name, filepath.Base(root), processOf(got), gotErr, processOf(want), wantErr)
			}
		}
	}
}

// withUIDGIDKeptGroups starts from a user with supplementary groups, which options replace
// or append to.
func withUIDGIDKeptGroups(uid, gid uint32) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Process.User.UID, s.Process.User.GID, s.Process.User.AdditionalGids = uid, gid, []uint32{gid, 99}
		return nil
	}
}

func processOf(s *oci.Spec) any {
	if s == nil || s.Process == nil {
		return nil
	}
	return s.Process.User
}

// TestReplaceOrAppendEnvValues: the image's environment under the pod's, as oci.WithEnv
// (the same function in pkg/oci) merges them.
func TestReplaceOrAppendEnvValues(t *testing.T) {
	defaults := []string{"PATH=/bin", "A=1", "B=2", "A=0"}
	overrides := []string{"A=3", "B", "C=4", "C=5", "C", "D", "E="}
	s := &oci.Spec{Process: &specs.Process{Env: slices.Clone(defaults)}}
	if err := oci.WithEnv(overrides)(context.Background(), nil, nil, s); err != nil {
		t.Fatal(err)
	}
	if got := replaceOrAppendEnvValues(defaults, overrides); !reflect.DeepEqual(got, s.Process.Env) {
		t.Errorf("got %q, containerd's %q", got, s.Process.Env)
	}
}
