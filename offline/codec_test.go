package offline

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestDecodeValueRejects(t *testing.T) {
	good, err := encodeValue(map[string]int{"a": 1})
	must(t, err)
	flipped := bytes.Clone(good)
	flipped[len(flipped)-2] ^= 0x01
	badJSON := []byte("{not json")
	framedBadJSON := binary.BigEndian.AppendUint32(nil, crc32.Checksum(badJSON, castagnoli))
	framedBadJSON = append(framedBadJSON, badJSON...)
	for name, raw := range map[string][]byte{
		"empty":         {},
		"short":         {1, 2},
		"flipped bit":   flipped,
		"unframed JSON": []byte(`{"a":1}`),
		"framed bad":    framedBadJSON,
	} {
		var v map[string]int
		if err := decodeValue(raw, &v); !errors.Is(err, errUndecodable) {
			t.Errorf("%s: %v, want errUndecodable", name, err)
		}
	}
	var v map[string]int
	if err := decodeValue(good, &v); err != nil || v["a"] != 1 {
		t.Errorf("good value: %v %v", v, err)
	}
}

func TestDecodeChecksKeys(t *testing.T) {
	raw, err := encodePod(sealing{}, SourceAPI, testPod("uid-1", "web"))
	must(t, err)
	if _, err := decodePod(sealing{}, "uid-2", raw); !errors.Is(err, errUndecodable) {
		t.Errorf("pod under another UID: %v", err)
	}
	raw, err = encodeValue(Admission{Accepted: true})
	must(t, err)
	if _, err := decodeAdmission(raw); !errors.Is(err, errUndecodable) {
		t.Errorf("admission without time: %v", err)
	}
}

func TestEncodingIsDeterministic(t *testing.T) {
	// Skip-unchanged compares bytes, so equal values must encode equally:
	// maps in any insertion order, times in any zone.
	a := testPod("uid-1", "web")
	a.Annotations = map[string]string{"x": "1", "y": "2", "z": "3"}
	b := a.DeepCopy()
	b.Annotations = map[string]string{"z": "3", "y": "2", "x": "1"}
	ra, _ := encodePod(sealing{}, SourceAPI, a)
	rb, _ := encodePod(sealing{}, SourceAPI, b)
	if !bytes.Equal(ra, rb) {
		t.Error("equal pods encode differently")
	}
	u1 := StatusUpdate{UID: "u", Timestamp: t0}
	u2 := StatusUpdate{UID: "u", Timestamp: t0.In(time.FixedZone("Z", 3600))}
	r1, _ := encodeStatus(u1)
	r2, _ := encodeStatus(u2)
	if !bytes.Equal(r1, r2) {
		t.Error("equal instants in different zones encode differently")
	}
}

func TestCoalesce(t *testing.T) {
	e := func(seq uint64, uid types.UID, phase v1.PodPhase, min int) sequencedStatus {
		return sequencedStatus{seq, outboxEntry{UID: uid, Name: string(uid), Status: v1.PodStatus{Phase: phase}, Timestamp: t0.Add(time.Duration(min) * time.Minute)}}
	}
	type want struct {
		uid             types.UID
		phase           v1.PodPhase
		first, last, n  int
		firstAt, lastAt int
	}
	cases := []struct {
		name string
		in   []sequencedStatus
		want []want
	}{
		{"empty", nil, nil},
		{"one", []sequencedStatus{e(4, "a", v1.PodRunning, 1)}, []want{{"a", v1.PodRunning, 4, 4, 1, 1, 1}}},
		{"latest wins, order of first entry", []sequencedStatus{
			e(1, "a", v1.PodPending, 1), e(2, "b", v1.PodPending, 2), e(3, "a", v1.PodRunning, 3),
			e(7, "c", v1.PodRunning, 4), e(9, "b", v1.PodFailed, 5),
		}, []want{
			{"a", v1.PodRunning, 1, 3, 2, 1, 3},
			{"b", v1.PodFailed, 2, 9, 2, 2, 5},
			{"c", v1.PodRunning, 7, 7, 1, 4, 4},
		}},
		{"gaps in sequence are fine", []sequencedStatus{e(10, "b", v1.PodPending, 0), e(20, "a", v1.PodPending, 0), e(30, "b", v1.PodSucceeded, 9)},
			[]want{{"b", v1.PodSucceeded, 10, 30, 2, 0, 9}, {"a", v1.PodPending, 20, 20, 1, 0, 0}}},
	}
	for _, c := range cases {
		o := newOutboxState()
		for _, e := range c.in {
			o.appendStatus(e.seq, e.entry)
		}
		got := o.pendingStatuses()
		if len(got) != len(c.want) {
			t.Errorf("%s: %d pending, want %d", c.name, len(got), len(c.want))
			continue
		}
		for i, w := range c.want {
			g := got[i]
			if g.UID != w.uid || g.Status.Phase != w.phase || g.FirstSeq != uint64(w.first) || g.LastSeq != uint64(w.last) ||
				g.Entries != w.n || !g.FirstTimestamp.Equal(t0.Add(time.Duration(w.firstAt)*time.Minute)) ||
				!g.Timestamp.Equal(t0.Add(time.Duration(w.lastAt)*time.Minute)) {
				t.Errorf("%s: [%d] = %+v, want %+v", c.name, i, g, w)
			}
		}
	}
}
