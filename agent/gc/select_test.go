package gc

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/agent/runtime"
)

var now = time.Date(2026, 11, 2, 12, 0, 0, 0, time.UTC)

// ctr is a container of pod p, container name n, attempt a, in state s, finished ago.
func ctr(p, n string, a int, s runtime.State, ago time.Duration) runtime.Container {
	c := runtime.Container{ID: fmt.Sprintf("%s-%s-%d", p, n, a), PodUID: p, Name: n, Attempt: a, State: s, CreatedAt: now.Add(-time.Hour)}
	if s == runtime.StateExited {
		c.FinishedAt = now.Add(-ago)
	}
	return c
}

func known(uids ...string) func(types.UID) bool {
	return func(u types.UID) bool {
		for _, k := range uids {
			if string(u) == k {
				return true
			}
		}
		return false
	}
}

func ids(cs []runtime.Container) string {
	var out []string
	for _, c := range cs {
		out = append(out, c.ID)
	}
	return strings.Join(out, " ")
}

func TestSelectContainers(t *testing.T) {
	const (
		exited  = runtime.StateExited
		running = runtime.StateRunning
		created = runtime.StateCreated
	)
	for _, tc := range []struct {
		name   string
		cs     []runtime.Container
		pods   PodState
		policy ContainerPolicy
		want   string
	}{
		{
			name: "running latest keeps the newest dead one (its lastState)",
			cs:   []runtime.Container{ctr("p", "a", 0, exited, time.Hour), ctr("p", "a", 1, exited, time.Hour), ctr("p", "a", 2, running, 0)},
			pods: PodState{Complete: true, Known: known("p")}, policy: ContainerPolicy{MaxDeadPerContainer: 1},
			want: "p-a-0",
		},
		{
			name: "dead latest is the one kept",
			cs:   []runtime.Container{ctr("p", "a", 3, exited, time.Hour), ctr("p", "a", 1, exited, time.Hour), ctr("p", "a", 2, exited, time.Hour)},
			pods: PodState{Complete: true, Known: known("p")}, policy: ContainerPolicy{MaxDeadPerContainer: 1},
			want: "p-a-2 p-a-1",
		},
		{
			name: "the latest attempt is kept whatever the count",
			cs:   []runtime.Container{ctr("p", "a", 0, exited, time.Hour)},
			pods: PodState{Complete: true, Known: known("p")}, policy: ContainerPolicy{MaxDeadPerContainer: 0},
			want: "",
		},
		{
			name: "per container, not per pod",
			cs: []runtime.Container{ctr("p", "a", 0, exited, time.Hour), ctr("p", "a", 1, running, 0),
				ctr("p", "b", 0, exited, time.Hour), ctr("p", "b", 1, exited, time.Hour), ctr("p", "b", 2, created, 0)},
			pods: PodState{Complete: true, Known: known("p")}, policy: ContainerPolicy{MaxDeadPerContainer: 1},
			want: "p-b-0",
		},
		{
			name: "keep two",
			cs:   []runtime.Container{ctr("p", "a", 0, exited, time.Hour), ctr("p", "a", 1, exited, time.Hour), ctr("p", "a", 2, exited, time.Hour), ctr("p", "a", 3, running, 0)},
			pods: PodState{Complete: true, Known: known("p")}, policy: ContainerPolicy{MaxDeadPerContainer: 2},
			want: "p-a-0",
		},
		{
			name: "too recent to go",
			cs:   []runtime.Container{ctr("p", "a", 0, exited, time.Second), ctr("p", "a", 1, exited, time.Second), ctr("p", "a", 2, running, 0)},
			pods: PodState{Complete: true, Known: known("p")}, policy: ContainerPolicy{MaxDeadPerContainer: 1, MinAge: time.Minute},
			want: "",
		},
		{
			name: "gone pod: every exited container, never a running one",
			cs:   []runtime.Container{ctr("gone", "a", 0, exited, time.Hour), ctr("gone", "a", 1, exited, time.Hour), ctr("gone", "b", 0, running, 0), ctr("gone", "c", 0, created, 0)},
			pods: PodState{Complete: true, Known: known()}, policy: ContainerPolicy{MaxDeadPerContainer: 1},
			want: "gone-a-1 gone-a-0",
		},
		{
			name: "unknown pod before the sources are complete: nothing",
			cs:   []runtime.Container{ctr("new", "a", 0, exited, time.Hour), ctr("new", "a", 1, exited, time.Hour)},
			pods: PodState{Complete: false, Known: known()}, policy: ContainerPolicy{MaxDeadPerContainer: 1},
			want: "",
		},
		{
			name: "known pods are collected before the sources are complete",
			cs:   []runtime.Container{ctr("p", "a", 0, exited, time.Hour), ctr("p", "a", 1, exited, time.Hour)},
			pods: PodState{Complete: false, Known: known("p")}, policy: ContainerPolicy{MaxDeadPerContainer: 1},
			want: "p-a-0",
		},
		{
			name: "not holdfast's",
			cs:   []runtime.Container{{ID: "x", State: exited}},
			pods: PodState{Complete: true, Known: known()}, policy: ContainerPolicy{MaxDeadPerContainer: 1},
			want: "",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ids(SelectContainers(tc.cs, tc.pods, tc.policy, now)); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestSelectPodLogDirs(t *testing.T) {
	dirs := []string{"default_web_u1", "default_gone_u2", "kube-system_dns_u3", "default_dead_u4", "stray-file", "a_b", "x_y_z_u5"}
	cs := []runtime.Container{ctr("u4", "a", 0, runtime.StateExited, time.Hour)}
	if got := SelectPodLogDirs(dirs, cs, PodState{Complete: true, Known: known("u1", "u3")}); fmt.Sprint(got) != "[default_gone_u2]" {
		t.Fatalf("got %v", got)
	}
	if got := SelectPodLogDirs(dirs, cs, PodState{Complete: false, Known: known()}); got != nil {
		t.Fatalf("before the sources are complete: %v", got)
	}
}

func dg(s string) digest.Digest { return digest.FromString(s) }

func names(imgs []Image) string {
	var out []string
	for _, i := range imgs {
		out = append(out, i.Name)
	}
	return strings.Join(out, " ")
}

func TestSelectImages(t *testing.T) {
	old := now.Add(-24 * time.Hour)
	imgs := []Image{
		{Name: "docker.io/x/oldest:1", Digest: dg("oldest"), Size: 100, Updated: old.Add(-2 * time.Hour)},
		{Name: "docker.io/x/older:1", Digest: dg("older"), Size: 100, Updated: old.Add(-time.Hour)},
		// Used an hour ago, arrived long before: its last use counts.
		{Name: "docker.io/x/used-lately:1", Digest: dg("lately"), Size: 100, Updated: old.Add(-48 * time.Hour), LastUsed: now.Add(-time.Hour)},
		// Two names of one image: they go together and count once.
		{Name: "docker.io/x/twin:a", Digest: dg("twin"), Size: 300, Updated: old},
		{Name: "docker.io/x/twin:b", Digest: dg("twin"), Size: 300, Updated: old},
		{Name: "docker.io/x/used:1", Digest: dg("used"), Size: 1000, Updated: old.Add(-72 * time.Hour)},
		{Name: "docker.io/x/used-by-digest:1", Digest: dg("bydigest"), Size: 1000, Updated: old.Add(-72 * time.Hour)},
		{Name: "docker.io/x/alias-of-used:1", Digest: dg("used"), Size: 1000, Updated: old.Add(-72 * time.Hour)},
		{Name: "registry.k8s.io/pause:3.6", Digest: dg("pause"), Size: 1000, Updated: old.Add(-72 * time.Hour)},
		{Name: "docker.io/x/fresh:1", Digest: dg("fresh"), Size: 1000, Updated: now.Add(-time.Second)},
	}
	inUse := map[string]bool{"docker.io/x/used:1": true, dg("bydigest").String(): true}
	pinned := map[string]bool{"registry.k8s.io/pause:3.6": true}
	for _, tc := range []struct {
		free int64
		want string
	}{
		{0, ""},
		{-5, ""},
		{1, "docker.io/x/oldest:1"},
		{100, "docker.io/x/oldest:1"},
		{101, "docker.io/x/oldest:1 docker.io/x/older:1"},
		{201, "docker.io/x/oldest:1 docker.io/x/older:1 docker.io/x/twin:a docker.io/x/twin:b"},
		{501, "docker.io/x/oldest:1 docker.io/x/older:1 docker.io/x/twin:a docker.io/x/twin:b docker.io/x/used-lately:1"},
		// Everything that may go, and no more: used, pinned and fresh images stay.
		{1 << 40, "docker.io/x/oldest:1 docker.io/x/older:1 docker.io/x/twin:a docker.io/x/twin:b docker.io/x/used-lately:1"},
	} {
		got := names(SelectImages(ImageSelection{Images: imgs, InUse: inUse, Pinned: pinned, BytesToFree: tc.free, MinAge: 2 * time.Minute, Now: now}))
		if got != tc.want {
			t.Errorf("free %d: got %q, want %q", tc.free, got, tc.want)
		}
	}
}

// TestSelectImagesNeverInUse: whatever the input, no selected name or digest is in use or
// pinned.
func TestSelectImagesNeverInUse(t *testing.T) {
	var imgs []Image
	for i := range 50 {
		imgs = append(imgs, Image{Name: fmt.Sprintf("docker.io/x/i%02d:1", i), Digest: dg(fmt.Sprint(i % 17)), Size: int64(i), Updated: now.Add(-time.Duration(i) * time.Hour)})
	}
	inUse := map[string]bool{"docker.io/x/i03:1": true, "docker.io/x/i40:1": true, dg("5").String(): true}
	pinned := map[string]bool{"docker.io/x/i07:1": true}
	sel := SelectImages(ImageSelection{Images: imgs, InUse: inUse, Pinned: pinned, BytesToFree: 1 << 40, Now: now})
	blocked := map[digest.Digest]bool{dg("3"): true, dg(fmt.Sprint(40 % 17)): true, dg("5"): true, dg("7"): true}
	for _, s := range sel {
		if blocked[s.Digest] {
			t.Errorf("selected %s whose digest is in use or pinned", s.Name)
		}
	}
	if len(sel) == 0 {
		t.Fatal("nothing selected")
	}
}

func TestBytesToFree(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		capacity, available uint64
		high, low           int
		want                int64
	}{
		{100 * gib, 20 * gib, 85, 80, 0},                             // 80% used
		{100 * gib, 16 * gib, 85, 80, 0},                             // 84%
		{100 * gib, 15 * gib, 85, 80, 5 * gib},                       // 85%: down to 80%
		{100 * gib, 5 * gib, 85, 80, 15 * gib},                       // 95%
		{100 * gib, 0, 85, 80, 20 * gib},                             // full
		{100 * gib, 5 * gib, 100, 80, 0},                             // disabled
		{0, 0, 85, 80, 0},                                            // no file system
		{100 * gib, 100 * gib, 0, 0, 0},                              // empty
		{100 * gib, 99 * gib, 1, 0, 1 * gib},                         // everything unused must go
		{1000, 100, 85, 80, 100},                                     // small numbers
		{1 << 50, 1 << 45, 85, 80, (1<<50 - 1<<45) - (1<<50)*80/100}, // no overflow at a petabyte
	} {
		if got := BytesToFree(tc.capacity, tc.available, tc.high, tc.low); got != tc.want {
			t.Errorf("BytesToFree(%d, %d, %d, %d) = %d, want %d", tc.capacity, tc.available, tc.high, tc.low, got, tc.want)
		}
	}
}
