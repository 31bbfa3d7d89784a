package offline

import "k8s.io/apimachinery/pkg/types"

// sequencedStatus is one decoded outbox entry with its sequence number.
type sequencedStatus struct {
	seq   uint64
	entry outboxEntry
}

// coalesce folds outbox entries, given in increasing sequence order, into
// one PendingStatus per pod: the latest status, ordered by the pod's first
// pending entry. Both stores use it so they cannot disagree.
func coalesce(entries []sequencedStatus) []PendingStatus {
	var out []PendingStatus
	index := make(map[types.UID]int)
	for _, e := range entries {
		i, seen := index[e.entry.UID]
		if !seen {
			index[e.entry.UID] = len(out)
			out = append(out, PendingStatus{
				UID:            e.entry.UID,
				FirstSeq:       e.seq,
				FirstTimestamp: e.entry.Timestamp,
			})
			i = len(out) - 1
		}
		p := &out[i]
		p.Namespace, p.Name = e.entry.Namespace, e.entry.Name
		p.Status, p.Timestamp = e.entry.Status, e.entry.Timestamp
		p.LastSeq = e.seq
		p.Entries++
	}
	return out
}
