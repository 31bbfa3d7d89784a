package events

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func ev(uid types.UID, name string, count int32) *v1.Event {
	return &v1.Event{ObjectMeta: metav1.ObjectMeta{Name: name}, InvolvedObject: v1.ObjectReference{UID: uid}, Count: count, Reason: name}
}

func reasons(es []v1.Event) string {
	var out []string
	for _, e := range es {
		out = append(out, fmt.Sprintf("%s/%d", e.Reason, e.Count))
	}
	return fmt.Sprint(out)
}

func TestRecentIsBounded(t *testing.T) {
	r := NewRecent(3, 5)
	for i := range 4 {
		r.Add(ev("a", fmt.Sprintf("e%d", i), 1))
	}
	if got := reasons(r.For("a")); got != "[e1/1 e2/1 e3/1]" {
		t.Errorf("per object: %s, want the last three", got)
	}
	// An aggregated repeat replaces its earlier copy and moves to the end.
	r.Add(ev("a", "e1", 2))
	if got := reasons(r.For("a")); got != "[e2/1 e3/1 e1/2]" {
		t.Errorf("repeat: %s", got)
	}
	// Overall cap: the object whose latest event is oldest loses its oldest events first.
	r.Add(ev("b", "x", 1))
	r.Add(ev("b", "y", 1))
	r.Add(ev("b", "z", 1))
	if got := reasons(r.For("a")); got != "[e3/1 e1/2]" {
		t.Errorf("a after the cap: %s", got)
	}
	if got := reasons(r.For("b")); got != "[x/1 y/1 z/1]" {
		t.Errorf("b: %s", got)
	}
	if r.For("nope") != nil {
		t.Errorf("unknown object has events")
	}
}
