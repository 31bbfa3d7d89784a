package offline

import (
	"cmp"
	"maps"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// outboxState is the outbox as both stores keep it in memory: for each pod, the latest status
// the node computed, delivered or not, and how much of it is pending. BoltStore replays it from
// its status journal (journal.go); MemStore keeps only this.
//
// The latest status is kept once delivered, until its pod's record goes: it is the pod's status
// at an offline restart (LoadPods and GetPod give it), so the pod record need not be written
// again for each status change, nor for the apiserver's echo of it.
type outboxState struct {
	pods map[types.UID]*outboxPod
	// lastSeq is the highest sequence number ever handed out: numbers are never reused, also
	// after every pod's entry went.
	lastSeq    uint64
	superseded uint64
}

// outboxPod is one pod's outbox.
type outboxPod struct {
	// latest is the pod's latest status, with its sequence number.
	latest    outboxEntry
	latestSeq uint64
	// pending counts the entries not delivered: 0 (latest delivered), 1 (latest) or 2 (the
	// oldest pending entry, firstSeq, and latest; those between were superseded).
	pending        int
	firstSeq       uint64
	firstTimestamp time.Time
	// recordGone: the pod's record was deleted while a status was pending; the entry goes
	// once it is delivered.
	recordGone bool
}

func newOutboxState() outboxState { return outboxState{pods: map[types.UID]*outboxPod{}} }

// appendStatus adds e under seq, which must be above every number handed out. A pending
// entry between the pod's oldest and this one is superseded (counted).
func (o *outboxState) appendStatus(seq uint64, e outboxEntry) {
	o.lastSeq = max(o.lastSeq, seq)
	p := o.pods[e.UID]
	if p == nil {
		p = &outboxPod{}
		o.pods[e.UID] = p
	}
	switch p.pending {
	case 0:
		p.pending, p.firstSeq, p.firstTimestamp = 1, seq, e.Timestamp
	case 1:
		p.pending = 2
	default:
		o.superseded++ // the pending entry between the oldest and this one
	}
	p.latest, p.latestSeq = e, seq
}

// ack marks the pod's entries up to upTo delivered. changed reports whether it marked any;
// gone whether the pod's entry went altogether (delivered, and its record gone).
func (o *outboxState) ack(uid types.UID, upTo uint64) (changed, gone bool) {
	p := o.pods[uid]
	if p == nil || p.pending == 0 || p.firstSeq > upTo {
		return false, false
	}
	if p.latestSeq <= upTo {
		p.pending, p.firstSeq, p.firstTimestamp = 0, 0, time.Time{}
		if p.recordGone {
			delete(o.pods, uid)
			return true, true
		}
		return true, false
	}
	// The oldest was delivered, the latest was not.
	p.pending, p.firstSeq, p.firstTimestamp = 1, p.latestSeq, p.latest.Timestamp
	return true, false
}

// recordDeleted is told that the pod's record went: its delivered status goes with it, a
// pending one stays until delivered. It reports whether the pod's entry went.
func (o *outboxState) recordDeleted(uid types.UID) (gone bool) {
	p := o.pods[uid]
	if p == nil {
		return false
	}
	if p.pending == 0 {
		delete(o.pods, uid)
		return true
	}
	p.recordGone = true
	return false
}

// recordPut is told that the pod has a record (again, after it went with a status pending):
// its status stays once delivered.
func (o *outboxState) recordPut(uid types.UID) {
	if p := o.pods[uid]; p != nil {
		p.recordGone = false
	}
}

// takeOver makes each pod's latest status in l (the outbox of an agent before two journal
// files, newer than o) the pod's latest here, numbered above every number o and l handed out,
// in the order l numbered them; pending if it was pending in l (the latest alone: a pending
// older one is superseded by it).
func (o *outboxState) takeOver(l outboxState) {
	o.lastSeq = max(o.lastSeq, l.lastSeq)
	uids := slices.Collect(maps.Keys(l.pods))
	slices.SortFunc(uids, func(a, b types.UID) int { return cmp.Compare(l.pods[a].latestSeq, l.pods[b].latestSeq) })
	for _, uid := range uids {
		lp := l.pods[uid]
		o.lastSeq++
		p := &outboxPod{latest: lp.latest, latestSeq: o.lastSeq, recordGone: lp.recordGone}
		if lp.pending > 0 {
			p.pending, p.firstSeq, p.firstTimestamp = 1, o.lastSeq, lp.firstTimestamp
		}
		o.pods[uid] = p
	}
}

// forget drops the pod's entry, pending or not.
func (o *outboxState) forget(uid types.UID) { delete(o.pods, uid) }

// pendingStatuses is the outbox coalesced per pod, in the order of each pod's oldest pending
// entry.
func (o *outboxState) pendingStatuses() []PendingStatus {
	var out []PendingStatus
	for uid, p := range o.pods {
		if p.pending == 0 {
			continue
		}
		out = append(out, PendingStatus{
			UID: uid, Namespace: p.latest.Namespace, Name: p.latest.Name,
			Status: *p.latest.Status.DeepCopy(), Timestamp: p.latest.Timestamp,
			FirstSeq: p.firstSeq, FirstTimestamp: p.firstTimestamp,
			LastSeq: p.latestSeq, Entries: p.pending,
		})
	}
	slices.SortFunc(out, func(a, b PendingStatus) int { return cmp.Compare(a.FirstSeq, b.FirstSeq) })
	return out
}

// pendingLen counts the pending entries (at most two per pod).
func (o *outboxState) pendingLen() int {
	n := 0
	for _, p := range o.pods {
		n += p.pending
	}
	return n
}

// latestStatus is the pod's latest status, delivered or not.
func (o *outboxState) latestStatus(uid types.UID) (v1.PodStatus, bool) {
	p := o.pods[uid]
	if p == nil {
		return v1.PodStatus{}, false
	}
	return *p.latest.Status.DeepCopy(), true
}
