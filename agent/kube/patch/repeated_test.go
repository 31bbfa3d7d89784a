package patch

// Attacks on TwoWay: statuses as the agent computes them (agent/status keepForeignConditions,
// agent/node withOwnedStatus) on top of what other writers may have stored, judged by
// strategicpatch: TwoWay's patch must be computed whenever CreateTwoWayMergePatch's is, and
// applied by strategicpatch.StrategicMergePatch (the apiserver's code) to the original and to
// a third status another writer changed, it must give what strategicpatch's own patch gives.

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"reflect"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
)

// judge computes TwoWay's patch and strategicpatch's from orig to mod and fails unless TwoWay
// computes one, it turns orig into mod, and on each of theirs it does what strategicpatch's
// patch does (both refused, or the same status).
func judge(t *testing.T, orig, mod any, typ any, schema Schema, theirs ...any) {
	t.Helper()
	origData, _ := json.Marshal(orig)
	modData, _ := json.Marshal(mod)
	lib, err := strategicpatch.CreateTwoWayMergePatch(origData, modData, typ)
	if err != nil {
		t.Fatalf("strategicpatch computes no patch either (not a difference): %v", err)
	}
	ours, err := TwoWay(orig, mod, schema)
	if err != nil {
		t.Fatalf("TwoWay: %v\nstrategicpatch's patch: %s", err, lib)
	}
	if got, want := apply(t, orig, ours, typ), apply(t, mod, []byte("{}"), typ); !reflect.DeepEqual(got, want) {
		t.Fatalf("the patch %s does not turn the original into the modified status: %s", ours, firstDifference("", got, want))
	}
	for i, th := range append([]any{orig}, theirs...) {
		got, errOurs := tryApply(th, ours, typ)
		want, errLib := tryApply(th, lib, typ)
		if (errOurs == nil) != (errLib == nil) || !reflect.DeepEqual(got, want) {
			t.Fatalf("status %d: the patch\n%s\ndoes otherwise than strategicpatch's\n%s\n(%v; %v) %s", i, ours, lib, errOurs, errLib, firstDifference("", got, want))
		}
	}
}

// keepForeign is agent/status keepForeignConditions (the package cannot be imported here: it
// imports this one): the conditions of the apiserver's status that the agent does not own and
// st lacks are appended to st.
func keepForeign(sent, st v1.PodStatus) v1.PodStatus {
	owned := map[v1.PodConditionType]bool{v1.PodScheduled: true, v1.PodInitialized: true, v1.ContainersReady: true, v1.PodReady: true}
	var missing []v1.PodCondition
	for _, c := range sent.Conditions {
		if owned[c.Type] {
			continue
		}
		found := false
		for _, own := range st.Conditions {
			found = found || own.Type == c.Type
		}
		if !found {
			missing = append(missing, c)
		}
	}
	st.Conditions = append(append([]v1.PodCondition(nil), st.Conditions...), missing...)
	return st
}

// A readiness-gate owner (or any writer using PUT pods/status, or a JSON merge patch of
// status.conditions) stored its condition twice: the apiserver's validation does not require
// condition types to be unique, and since structured-merge-diff v4.4 (kubernetes#121575) the
// apiserver keeps duplicate keys of a listType=map that a create or update brings. The agent
// keeps that writer's conditions as they are (keepForeignConditions), so its modified status
// has the duplicate too. strategicpatch computes the patch of the agent's own Ready and
// ContainersReady (and the apiserver applies it); TwoWay refuses: the pod's status is never
// written again (statusDiffers answers false on the error, Manager.patch fails at every
// sync), so the pod never turns Ready, never reaches Succeeded/Failed, and a pod being
// deleted is never finished (Manager.delete is reached only after a successful patch).
func TestRepeatedForeignPodConditionPatched(t *testing.T) {
	ts := metav1.NewTime(time.Unix(1_700_000_000, 0))
	gate := v1.PodCondition{Type: "example.com/gate", Status: v1.ConditionTrue, LastTransitionTime: ts}
	gateAgain := v1.PodCondition{Type: "example.com/gate", Status: v1.ConditionFalse, Reason: "Stale", LastTransitionTime: ts}
	sent := v1.PodStatus{
		Phase: v1.PodRunning,
		Conditions: []v1.PodCondition{
			{Type: v1.PodInitialized, Status: v1.ConditionTrue, LastTransitionTime: ts},
			{Type: v1.PodReady, Status: v1.ConditionFalse, LastTransitionTime: ts},
			{Type: v1.ContainersReady, Status: v1.ConditionFalse, LastTransitionTime: ts},
			{Type: v1.PodScheduled, Status: v1.ConditionTrue, LastTransitionTime: ts},
			gate, gateAgain,
		},
		PodIP: "10.1.0.1", PodIPs: []v1.PodIP{{IP: "10.1.0.1"}},
	}
	later := metav1.NewTime(ts.Add(5 * time.Second))
	ours := v1.PodStatus{
		Phase: v1.PodRunning,
		Conditions: []v1.PodCondition{
			{Type: v1.PodInitialized, Status: v1.ConditionTrue, LastTransitionTime: ts},
			{Type: v1.PodReady, Status: v1.ConditionTrue, LastTransitionTime: later},
			{Type: v1.ContainersReady, Status: v1.ConditionTrue, LastTransitionTime: later},
			{Type: v1.PodScheduled, Status: v1.ConditionTrue, LastTransitionTime: ts},
		},
		PodIP: "10.1.0.1", PodIPs: []v1.PodIP{{IP: "10.1.0.1"}},
	}
	mod := keepForeign(sent, ours)
	// Meanwhile the gate's owner flipped its (first) condition.
	theirs := *sent.DeepCopy()
	theirs.Conditions[4].Status = v1.ConditionFalse
	judge(t, v1.Pod{Status: sent}, v1.Pod{Status: mod}, v1.Pod{}, Pod, v1.Pod{Status: theirs})
}

// The same on the node: a node-problem-detector-like writer that updates the node's status
// stored its condition type twice. withOwnedStatus keeps other writers' conditions as they
// are, so every node status patch (each heartbeat moves Ready's lastHeartbeatTime) fails from
// then on: no condition, capacity, allocatable, image or nodeInfo change is written again.
func TestRepeatedForeignNodeConditionPatched(t *testing.T) {
	ts := metav1.NewTime(time.Unix(1_700_000_000, 0))
	problem := v1.NodeCondition{Type: "example.com/KernelDeadlock", Status: v1.ConditionFalse, LastHeartbeatTime: ts, LastTransitionTime: ts}
	problemAgain := v1.NodeCondition{Type: "example.com/KernelDeadlock", Status: v1.ConditionTrue, Reason: "Old", LastHeartbeatTime: ts, LastTransitionTime: ts}
	node := v1.NodeStatus{
		Conditions: []v1.NodeCondition{
			problem, problemAgain,
			{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: ts, LastTransitionTime: ts},
		},
		Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.0.2.1"}, {Type: v1.NodeHostName, Address: "gw"}},
	}
	// withOwnedStatus: the others' conditions first, as they are, then the agent's.
	mod := *node.DeepCopy()
	mod.Conditions[2].LastHeartbeatTime = metav1.NewTime(ts.Add(10 * time.Second))
	judge(t, v1.Node{Status: node}, v1.Node{Status: mod}, v1.Node{}, Node)
}

// The duplicates need not be the writer's own: two writers racing on a PUT of status can leave
// any condition twice, one the agent owns included; then the agent's own conditions cannot
// be patched either. strategicpatch computes a patch; TwoWay none.
func TestRepeatedOwnedPodConditionPatched(t *testing.T) {
	ts := metav1.NewTime(time.Unix(1_700_000_000, 0))
	sent := v1.PodStatus{
		Phase: v1.PodPending,
		Conditions: []v1.PodCondition{
			{Type: v1.PodScheduled, Status: v1.ConditionTrue, LastTransitionTime: ts},
			{Type: v1.PodScheduled, Status: v1.ConditionTrue, LastTransitionTime: ts},
		},
	}
	mod := v1.PodStatus{
		Phase: v1.PodRunning,
		Conditions: []v1.PodCondition{
			{Type: v1.PodScheduled, Status: v1.ConditionTrue, LastTransitionTime: ts},
			{Type: v1.PodReady, Status: v1.ConditionTrue, LastTransitionTime: ts},
		},
	}
	origData, _ := json.Marshal(v1.Pod{Status: sent})
	modData, _ := json.Marshal(v1.Pod{Status: mod})
	lib, err := strategicpatch.CreateTwoWayMergePatch(origData, modData, v1.Pod{})
	if err != nil {
		t.Fatalf("strategicpatch computes no patch either: %v", err)
	}
	ours, err := TwoWay(v1.Pod{Status: sent}, v1.Pod{Status: mod}, Pod)
	if err != nil {
		t.Fatalf("TwoWay: %v\nstrategicpatch's patch: %s", err, lib)
	}
	// strategicpatch's patch deletes both PodScheduled (its delete directive removes every
	// element of the key) and the agent's stale check writes it back in the next round: the
	// status converges, deduplicated. The judge here is only that TwoWay's patch does the same.
	got, errOurs := tryApply(v1.Pod{Status: sent}, ours, v1.Pod{})
	want, errLib := tryApply(v1.Pod{Status: sent}, lib, v1.Pod{})
	if (errOurs == nil) != (errLib == nil) || !reflect.DeepEqual(got, want) {
		t.Fatalf("the patch\n%s\ndoes otherwise than strategicpatch's\n%s\n(%v; %v) %s", ours, lib, errOurs, errLib, firstDifference("", got, want))
	}
}

// Generated: the merging lists with duplicate keys in the apiserver's status (another writer's
// PUT), the agent's status keeping the foreign conditions as they are. Each pair is judged as
// above; the test stops at the first difference.
func TestGeneratedRepeatedForeignConditions(t *testing.T) {
	types := []v1.PodConditionType{"Ready", "ContainersReady", "Initialized", "PodScheduled"}
	foreign := []v1.PodConditionType{"example.com/gate", "DisruptionTarget"}
	for i := int64(0); i < 300; i++ {
		r := rand.New(rand.NewSource(i))
		var sent v1.PodStatus
		for _, j := range r.Perm(len(types))[:r.Intn(len(types)+1)] {
			sent.Conditions = append(sent.Conditions, v1.PodCondition{Type: types[j], Status: v1.ConditionStatus(fmt.Sprint(r.Intn(2)))})
		}
		f := foreign[r.Intn(len(foreign))]
		for k := 0; k < 2; k++ { // the foreign type twice, at random places
			at := r.Intn(len(sent.Conditions) + 1)
			c := v1.PodCondition{Type: f, Status: v1.ConditionStatus(fmt.Sprint(k))}
			sent.Conditions = append(sent.Conditions[:at], append([]v1.PodCondition{c}, sent.Conditions[at:]...)...)
		}
		var ours v1.PodStatus
		for _, j := range r.Perm(len(types))[:1+r.Intn(len(types))] {
			ours.Conditions = append(ours.Conditions, v1.PodCondition{Type: types[j], Status: v1.ConditionStatus(fmt.Sprint(r.Intn(2)))})
		}
		mod := keepForeign(sent, ours)
		if reflect.DeepEqual(asJSON(t, v1.Pod{Status: sent}), asJSON(t, v1.Pod{Status: mod})) {
			continue
		}
		t.Run(fmt.Sprint("seed", i), func(t *testing.T) {
			judge(t, v1.Pod{Status: sent}, v1.Pod{Status: mod}, v1.Pod{}, Pod)
		})
		if t.Failed() {
			return
		}
	}
}

// Generated: duplicate keys anywhere (the apiserver's status, the agent's, another writer's),
// judged only against strategicpatch (whose own patch does not always turn such an original
// into the modified status): TwoWay computes a patch whenever strategicpatch does, and it does
// on the original and on another writer's status what strategicpatch's does.
func TestGeneratedRepeatedKeys(t *testing.T) {
	types := []v1.PodConditionType{"Ready", "ContainersReady", "example.com/gate"}
	ips := []string{"10.1.0.1", "fd00::1"}
	random := func(r *rand.Rand) v1.PodStatus {
		var st v1.PodStatus
		for n := r.Intn(5); n > 0; n-- {
			st.Conditions = append(st.Conditions, v1.PodCondition{Type: types[r.Intn(len(types))], Status: v1.ConditionStatus(fmt.Sprint(r.Intn(2)))})
		}
		for n := r.Intn(3); n > 0; n-- {
			st.HostIPs = append(st.HostIPs, v1.HostIP{IP: ips[r.Intn(len(ips))]})
		}
		return st
	}
	for i := int64(0); i < 2000; i++ {
		r := rand.New(rand.NewSource(i))
		orig, mod, theirs := random(r), random(r), random(r)
		origData, _ := json.Marshal(v1.Pod{Status: orig})
		modData, _ := json.Marshal(v1.Pod{Status: mod})
		lib, err := strategicpatch.CreateTwoWayMergePatch(origData, modData, v1.Pod{})
		if err != nil {
			continue
		}
		ours, err := TwoWay(v1.Pod{Status: orig}, v1.Pod{Status: mod}, Pod)
		if err != nil {
			t.Fatalf("seed %d: TwoWay: %v\nstrategicpatch's patch: %s", i, err, lib)
		}
		for _, th := range []v1.PodStatus{orig, theirs} {
			got, errOurs := tryApply(v1.Pod{Status: th}, ours, v1.Pod{})
			want, errLib := tryApply(v1.Pod{Status: th}, lib, v1.Pod{})
			if (errOurs == nil) != (errLib == nil) || !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d: the patch\n%s\ndoes otherwise than strategicpatch's\n%s\n(%v; %v) %s", i, ours, lib, errOurs, errLib, firstDifference("", got, want))
			}
		}
	}
}

// Not a defect, kept as a guard: the correlator's patch of a repeated event (count, last time,
// message) is byte for byte the one client-go computed with strategicpatch, as doc.go says.
func TestEventCorrelatorPatchIsStrategicpatchs(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	messages := []string{"", "Started container app", "<a&b> \u00e9\u4e2d \x00 \xff", "x\ny"}
	for i := 0; i < 500; i++ {
		ev := v1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: "pod.17", Namespace: "ns", ResourceVersion: fmt.Sprint(r.Intn(1000))},
			InvolvedObject: v1.ObjectReference{Kind: "Pod", Name: "pod", Namespace: "ns", UID: "u"},
			Reason:         "Started", Message: messages[r.Intn(len(messages))], Type: v1.EventTypeNormal,
			FirstTimestamp: metav1.NewTime(time.Unix(1_700_000_000, 0)),
			LastTimestamp:  metav1.NewTime(time.Unix(1_700_000_000+r.Int63n(1000), 0)),
			Count:          int32(2 + r.Intn(1<<30)),
		}
		old := ev
		old.Count, old.LastTimestamp, old.Message = 0, metav1.NewTime(time.Unix(0, 0)), ""
		ours, err := TwoWay(old, &ev, None)
		if err != nil {
			t.Fatal(err)
		}
		oldData, _ := json.Marshal(old)
		newData, _ := json.Marshal(&ev)
		lib, err := strategicpatch.CreateTwoWayMergePatch(oldData, newData, &ev)
		if err != nil {
			t.Fatal(err)
		}
		if string(ours) != string(lib) {
			t.Fatalf("event patch %s, client-go's %s", ours, lib)
		}
	}
}
