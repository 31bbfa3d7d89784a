package patch

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"sigs.k8s.io/randfill"
)

// The schemas are the struct tags of k8s.io/api: a list that merges and is missing here would
// be sent whole, and the agent's patch would then delete what other writers put in it (another
// controller's condition); one listed that no longer merges would send a patch the apiserver
// applies otherwise. Only what a patch of the status can reach counts: the elements of a list
// that is sent whole are never patched, so the lists they hold do not matter.
func TestSchemasAreTheStructTags(t *testing.T) {
	for _, tc := range []struct {
		name   string
		obj    any
		schema Schema
	}{{"Pod", v1.Pod{}, Pod}, {"Node", v1.Node{}, Node}} {
		got := Schema{}
		statusField, _ := reflect.TypeOf(tc.obj).FieldByName("Status")
		mergingLists(statusField.Type, "status", got)
		if !reflect.DeepEqual(got, tc.schema) {
			t.Errorf("%s: the struct tags say %v, the schema %v", tc.name, got, tc.schema)
		}
	}
}

func mergingLists(t reflect.Type, path string, out Schema) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return
	}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" { // embedded
			mergingLists(f.Type, path, out)
			continue
		}
		p := path + "." + name
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if strategy := f.Tag.Get("patchStrategy"); strategy != "" && ft.Kind() != reflect.Slice {
			// A strategy on a struct or map field (retainKeys, replace) is a directive TwoWay
			// does not write: named here so that the schema test fails on it.
			out[p+" ("+strategy+")"] = "unsupported patchStrategy"
		}
		switch {
		case ft.Kind() == reflect.Slice:
			if strings.Contains(f.Tag.Get("patchStrategy"), "merge") {
				out[p] = f.Tag.Get("patchMergeKey")
				mergingLists(ft.Elem(), p, out)
			}
		case ft.Kind() == reflect.Struct && ft != reflect.TypeOf(metav1.Time{}):
			mergingLists(ft, p, out)
		}
	}
}

// statusFiller fills statuses at random from small domains, so that two of them share
// condition types, addresses and IPs often: elements added, changed, deleted and reordered.
func statusFiller(seed int64) *randfill.Filler {
	pick := func(r randfill.Continue, from ...string) string { return from[r.Intn(len(from))] }
	return randfill.NewWithSeed(seed).NilChance(0.3).NumElements(0, 4).Funcs(
		func(q *resource.Quantity, r randfill.Continue) {
			*q = *resource.NewQuantity(r.Int63n(64), resource.DecimalSI)
		},
		func(tm *metav1.Time, r randfill.Continue) {
			if r.Intn(4) == 0 {
				*tm = metav1.Time{}
				return
			}
			*tm = metav1.NewTime(time.Unix(1_700_000_000+r.Int63n(8), 0))
		},
		func(s *string, r randfill.Continue) {
			*s = pick(r, "", "a", "b", "Running")
		},
		func(c *v1.PodCondition, r randfill.Continue) {
			r.FillNoCustom(c)
			c.Type = v1.PodConditionType(pick(r, "Ready", "ContainersReady", "Initialized", "example.com/gate", "DisruptionTarget"))
		},
		func(c *v1.NodeCondition, r randfill.Continue) {
			r.FillNoCustom(c)
			c.Type = v1.NodeConditionType(pick(r, "Ready", "MemoryPressure", "DiskPressure", "example.com/Problem"))
		},
		func(a *v1.NodeAddress, r randfill.Continue) {
			a.Type = v1.NodeAddressType(pick(r, "InternalIP", "Hostname", "ExternalIP"))
			a.Address = pick(r, "10.0.0.1", "10.0.0.2", "gw")
		},
		func(ip *v1.PodIP, r randfill.Continue) { ip.IP = pick(r, "10.1.0.1", "10.1.0.2", "fd00::1") },
		func(ip *v1.HostIP, r randfill.Continue) { ip.IP = pick(r, "10.0.0.1", "10.0.0.2", "fd00::2") },
		func(c *v1.PodResourceClaimStatus, r randfill.Continue) {
			c.Name = pick(r, "gpu", "fpga")
			if r.Intn(2) == 0 {
				n := pick(r, "claim-1", "claim-2")
				c.ResourceClaimName = &n
			}
		},
		func(c *v1.NodeAllocatableResourceClaimStatus, r randfill.Continue) {
			r.FillNoCustom(c)
			c.ResourceClaimName = pick(r, "claim-1", "claim-2")
		},
	)
}

// uniqueKeys drops the elements of the merging lists whose key an earlier one has: the
// apiserver refuses such a status, and strategicpatch too.
func uniqueKeys[T any](l []T, key func(T) string) []T {
	seen := map[string]bool{}
	var out []T
	for _, e := range l {
		if !seen[key(e)] {
			seen[key(e)] = true
			out = append(out, e)
		}
	}
	return out
}

func randomPodStatus(f *randfill.Filler) v1.PodStatus {
	var st v1.PodStatus
	f.Fill(&st)
	st.Conditions = uniqueKeys(st.Conditions, func(c v1.PodCondition) string { return string(c.Type) })
	st.PodIPs = uniqueKeys(st.PodIPs, func(ip v1.PodIP) string { return ip.IP })
	st.HostIPs = uniqueKeys(st.HostIPs, func(ip v1.HostIP) string { return ip.IP })
	st.ResourceClaimStatuses = uniqueKeys(st.ResourceClaimStatuses, func(c v1.PodResourceClaimStatus) string { return c.Name })
	st.NodeAllocatableResourceClaimStatuses = uniqueKeys(st.NodeAllocatableResourceClaimStatuses, func(c v1.NodeAllocatableResourceClaimStatus) string { return c.ResourceClaimName })
	for i := range st.NodeAllocatableResourceClaimStatuses {
		c := &st.NodeAllocatableResourceClaimStatuses[i]
		c.Mapping = uniqueKeys(c.Mapping, func(m v1.NodeAllocatableMappedResources) string { return string(m.Name) })
		c.Overhead = uniqueKeys(c.Overhead, func(o v1.NodeAllocatableOverheadResources) string { return string(o.Name) })
	}
	return st
}

func randomNodeStatus(f *randfill.Filler) v1.NodeStatus {
	var st v1.NodeStatus
	f.Fill(&st)
	st.Conditions = uniqueKeys(st.Conditions, func(c v1.NodeCondition) string { return string(c.Type) })
	st.Addresses = uniqueKeys(st.Addresses, func(a v1.NodeAddress) string { return string(a.Type) })
	return st
}

// mutate changes some of st's fields the way a status moves on: a condition flips, an IP is
// added, a container restarts; the rest stays, so that patches are small as in the agent.
func mutatePodStatus(st v1.PodStatus, f *randfill.Filler, r *rand.Rand) v1.PodStatus {
	other := randomPodStatus(f)
	out := *st.DeepCopy()
	v, o := reflect.ValueOf(&out).Elem(), reflect.ValueOf(other)
	for i := 0; i < v.NumField(); i++ {
		if r.Intn(3) == 0 {
			v.Field(i).Set(o.Field(i))
		}
	}
	if len(out.Conditions) > 0 && r.Intn(2) == 0 { // one condition changed in place
		c := &out.Conditions[r.Intn(len(out.Conditions))]
		c.Status = v1.ConditionStatus(fmt.Sprint(r.Intn(3)))
	}
	return out
}

func mutateNodeStatus(st v1.NodeStatus, f *randfill.Filler, r *rand.Rand) v1.NodeStatus {
	other := randomNodeStatus(f)
	out := *st.DeepCopy()
	v, o := reflect.ValueOf(&out).Elem(), reflect.ValueOf(other)
	for i := 0; i < v.NumField(); i++ {
		if r.Intn(3) == 0 {
			v.Field(i).Set(o.Field(i))
		}
	}
	return out
}

// apply applies patch to base as the apiserver does, and gives the result as the apiserver
// would store it: decoded into the object's type (a null in a list sent whole leaves the
// field out, which decodes to the same zero value).
func apply(t *testing.T, base any, patch []byte, schema any) map[string]any {
	t.Helper()
	m, err := tryApply(base, patch, schema)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func tryApply(base any, patch []byte, schema any) (map[string]any, error) {
	data, err := json.Marshal(base)
	if err != nil {
		return nil, err
	}
	out, err := strategicpatch.StrategicMergePatch(data, patch, schema)
	if err != nil {
		return nil, fmt.Errorf("strategicpatch refuses the patch %s: %v", patch, err)
	}
	typed := reflect.New(reflect.TypeOf(schema))
	if err := json.Unmarshal(out, typed.Interface()); err != nil {
		return nil, err
	}
	data, err = json.Marshal(typed.Interface())
	if err != nil {
		return nil, err
	}
	var m map[string]any
	return m, json.Unmarshal(data, &m)
}

func asJSON(t *testing.T, v any) map[string]any {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// Generated pairs of statuses, and a third the apiserver holds meanwhile (another writer's
// changes on top of the original): the patch computed here, applied by strategicpatch (the
// apiserver's code), turns the original into the modified status, and does to the third
// exactly what strategicpatch's own patch does, so another writer's fields are kept as the
// kubelet keeps them.
func TestPatchesApplyAsStrategicpatchDoes(t *testing.T) {
	pairs := int64(400) // strategicpatch takes ~15 ms a pair of such statuses
	if testing.Short() {
		pairs = 100
	}
	for i := int64(0); i < pairs; i++ {
		f, r := statusFiller(i), rand.New(rand.NewSource(i))
		check := func(kind string, orig, mod, theirs, typ any, schema Schema) {
			t.Helper()
			ours, err := TwoWay(orig, mod, schema)
			if err != nil {
				t.Fatalf("seed %d %s: %v", i, kind, err)
			}
			if _, err := tryApply(orig, ours, typ); err != nil {
				t.Fatalf("seed %d %s: %v", i, kind, err)
			}
			if got, want := apply(t, orig, ours, typ), apply(t, mod, []byte("{}"), typ); !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d %s: the patch %s does not turn the original into the modified status: %s", i, kind, ours, firstDifference("", got, want))
			}
			origData, _ := json.Marshal(orig)
			modData, _ := json.Marshal(mod)
			lib, err := strategicpatch.CreateTwoWayMergePatch(origData, modData, typ)
			if err != nil {
				t.Fatalf("seed %d %s: strategicpatch: %v", i, kind, err)
			}
			// The apiserver may refuse a patch on another writer's status (an order naming an
			// element the other writer removed): then it must refuse strategicpatch's as well.
			got, errOurs := tryApply(theirs, ours, typ)
			want, errLib := tryApply(theirs, lib, typ)
			if (errOurs == nil) != (errLib == nil) {
				t.Fatalf("seed %d %s: on another writer's status: ours: %v; strategicpatch's: %v", i, kind, errOurs, errLib)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d %s: on another writer's status the patch\n%s\ndoes otherwise than strategicpatch's\n%s\n%s", i, kind, ours, lib, firstDifference("", got, want))
			}
			if (string(ours) == "{}") != (string(lib) == "{}") {
				t.Fatalf("seed %d %s: patch %s, strategicpatch's %s: one is empty", i, kind, ours, lib)
			}
		}
		po := randomPodStatus(f)
		pm := mutatePodStatus(po, f, r)
		pt := mutatePodStatus(po, f, r)
		check("pod", v1.Pod{Status: po}, v1.Pod{Status: pm}, v1.Pod{Status: pt}, v1.Pod{}, Pod)
		no := randomNodeStatus(f)
		nm := mutateNodeStatus(no, f, r)
		nt := mutateNodeStatus(no, f, r)
		check("node", v1.Node{Status: no}, v1.Node{Status: nm}, v1.Node{Status: nt}, v1.Node{}, Node)
	}
}

func TestNothingChangedIsAnEmptyPatch(t *testing.T) {
	f := statusFiller(1)
	st := randomPodStatus(f)
	p, err := TwoWay(v1.Pod{Status: st}, v1.Pod{Status: *st.DeepCopy()}, Pod)
	if err != nil || string(p) != "{}" {
		t.Fatalf("TwoWay of equal statuses = %s, %v; want {}", p, err)
	}
}

func TestMergingListErrors(t *testing.T) {
	// A condition without its type, and a podIPs element that is no object, cannot be
	// matched with the apiserver's: refused, as strategicpatch refuses them.
	noKey := map[string]any{"status": map[string]any{"conditions": []any{map[string]any{"status": "True"}}}}
	withKey := map[string]any{"status": map[string]any{"conditions": []any{map[string]any{"type": "Ready"}}}}
	if _, err := TwoWay(withKey, noKey, Pod); err == nil || !strings.Contains(err.Error(), `has no "type"`) {
		t.Errorf("a condition without a type: err = %v, want one naming the key", err)
	}
	notObject := map[string]any{"status": map[string]any{"podIPs": []any{"10.0.0.1"}}}
	ips := map[string]any{"status": map[string]any{"podIPs": []any{map[string]any{"ip": "10.0.0.2"}}}}
	if _, err := TwoWay(ips, notObject, Pod); err == nil || !strings.Contains(err.Error(), "not an object") {
		t.Errorf("a podIPs element that is no object: err = %v, want one saying so", err)
	}
}

// firstDifference names the first place where got and want differ, for a readable failure.
func firstDifference(path string, got, want any) string {
	if reflect.DeepEqual(got, want) {
		return ""
	}
	gm, ok1 := got.(map[string]any)
	wm, ok2 := want.(map[string]any)
	if ok1 && ok2 {
		for k := range wm {
			if _, ok := gm[k]; !ok {
				return fmt.Sprintf("%s.%s: got nothing, want %v", path, k, wm[k])
			}
			if d := firstDifference(path+"."+k, gm[k], wm[k]); d != "" {
				return d
			}
		}
		for k := range gm {
			if _, ok := wm[k]; !ok {
				return fmt.Sprintf("%s.%s: got %v, want nothing", path, k, gm[k])
			}
		}
	}
	gl, ok1 := got.([]any)
	wl, ok2 := want.([]any)
	if ok1 && ok2 && len(gl) == len(wl) {
		for i := range wl {
			if d := firstDifference(fmt.Sprintf("%s[%d]", path, i), gl[i], wl[i]); d != "" {
				return d
			}
		}
	}
	return fmt.Sprintf("%s: got %v, want %v", path, got, want)
}

// The merging lists alone, small and many: adds, changes, deletions and reorders, on a third
// status another writer changed the same lists of. Cheap enough for many pairs, so that the
// rare orders (where the deletions go in the patch) are reached.
func TestMergingListsApplyAsStrategicpatchDoes(t *testing.T) {
	pairs := int64(4000)
	if testing.Short() {
		pairs = 1000
	}
	types := []v1.PodConditionType{"Ready", "ContainersReady", "Initialized", "PodScheduled", "example.com/gate", "DisruptionTarget"}
	ips := []string{"10.1.0.1", "10.1.0.2", "fd00::1", "fd00::2"}
	random := func(r *rand.Rand) v1.PodStatus {
		var st v1.PodStatus
		for _, i := range r.Perm(len(types))[:r.Intn(len(types)+1)] {
			st.Conditions = append(st.Conditions, v1.PodCondition{Type: types[i], Status: v1.ConditionStatus(fmt.Sprint(r.Intn(2)))})
		}
		for _, i := range r.Perm(len(ips))[:r.Intn(len(ips)+1)] {
			st.PodIPs = append(st.PodIPs, v1.PodIP{IP: ips[i]})
		}
		for _, i := range r.Perm(len(ips))[:r.Intn(3)] {
			st.HostIPs = append(st.HostIPs, v1.HostIP{IP: ips[i]})
		}
		return st
	}
	for i := int64(0); i < pairs; i++ {
		r := rand.New(rand.NewSource(i))
		orig, mod, theirs := random(r), random(r), random(r)
		ours, err := TwoWay(v1.Pod{Status: orig}, v1.Pod{Status: mod}, Pod)
		if err != nil {
			t.Fatalf("seed %d: %v", i, err)
		}
		got, err := tryApply(v1.Pod{Status: orig}, ours, v1.Pod{})
		if err != nil {
			t.Fatalf("seed %d: %v", i, err)
		}
		if want := apply(t, v1.Pod{Status: mod}, []byte("{}"), v1.Pod{}); !reflect.DeepEqual(got, want) {
			t.Fatalf("seed %d: the patch %s does not turn the original into the modified status: %s", i, ours, firstDifference("", got, want))
		}
		origData, _ := json.Marshal(v1.Pod{Status: orig})
		modData, _ := json.Marshal(v1.Pod{Status: mod})
		lib, err := strategicpatch.CreateTwoWayMergePatch(origData, modData, v1.Pod{})
		if err != nil {
			t.Fatal(err)
		}
		got, errOurs := tryApply(v1.Pod{Status: theirs}, ours, v1.Pod{})
		want, errLib := tryApply(v1.Pod{Status: theirs}, lib, v1.Pod{})
		if (errOurs == nil) != (errLib == nil) || !reflect.DeepEqual(got, want) {
			t.Fatalf("seed %d: on another writer's status the patch\n%s\ndoes otherwise than strategicpatch's\n%s\n(%v; %v) %s", i, ours, lib, errOurs, errLib, firstDifference("", got, want))
		}
	}
}

// The walker behind TestSchemasAreTheStructTags sees what it must report: a merging list (and
// one inside it), and a strategy on a field that is no list, which TwoWay cannot honour.
func TestMergingListsWalker(t *testing.T) {
	type inner struct {
		Items []struct {
			Key string `json:"key"`
		} `json:"items" patchStrategy:"merge" patchMergeKey:"key"`
	}
	type status struct {
		Lists []inner            `json:"lists" patchStrategy:"merge" patchMergeKey:"name"`
		Kept  struct{ A string } `json:"kept" patchStrategy:"retainKeys"`
		Plain []string           `json:"plain"`
	}
	got := Schema{}
	mergingLists(reflect.TypeOf(status{}), "status", got)
	want := Schema{"status.lists": "name", "status.lists.items": "key", "status.kept (retainKeys)": "unsupported patchStrategy"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("mergingLists = %v, want %v", got, want)
	}
}
