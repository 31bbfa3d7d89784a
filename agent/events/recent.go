// Package events keeps the agent's recent Events in memory, by the object they are about, so
// that `holdfast describe` can show them on a gateway whose apiserver is out of reach (the
// apiserver's copy is the one kubectl reads). It is bounded: a few per object, a cap overall,
// the oldest dropped first. Nothing is written to disk: flash is not spent on them.
package events

import (
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Recent is a bounded memory of Events. The zero value is not usable; use NewRecent.
type Recent struct {
	perObject, total int

	mu    sync.Mutex
	byUID map[types.UID][]v1.Event
	order []types.UID // objects by their latest event, oldest first, for the overall cap
	count int
}

// NewRecent keeps at most perObject events per object and total overall.
func NewRecent(perObject, total int) *Recent {
	return &Recent{perObject: perObject, total: total, byUID: map[types.UID][]v1.Event{}}
}

// Add records e (an event broadcaster's watcher calls it). Repeats of an event the
// broadcaster aggregated arrive with a higher count and replace the earlier copy.
func (r *Recent) Add(e *v1.Event) {
	uid := e.InvolvedObject.UID
	if uid == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	list := r.byUID[uid]
	for i := range list {
		if list[i].Name == e.Name {
			list = append(list[:i], list[i+1:]...)
			r.count--
			break
		}
	}
	list = append(list, *e)
	r.count++
	if len(list) > r.perObject {
		list = list[len(list)-r.perObject:]
		r.count -= 1
	}
	r.byUID[uid] = list
	r.touch(uid)
	for r.count > r.total && len(r.order) > 0 {
		oldest := r.order[0]
		l := r.byUID[oldest]
		if len(l) <= 1 {
			delete(r.byUID, oldest)
			r.order = r.order[1:]
			r.count -= len(l)
			continue
		}
		r.byUID[oldest] = l[1:]
		r.count--
	}
}

// touch moves uid to the end of the order.
func (r *Recent) touch(uid types.UID) {
	for i, u := range r.order {
		if u == uid {
			r.order = append(r.order[:i], r.order[i+1:]...)
			break
		}
	}
	r.order = append(r.order, uid)
}

// For returns the events about the object uid, oldest first.
func (r *Recent) For(uid types.UID) []v1.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]v1.Event(nil), r.byUID[uid]...)
}
