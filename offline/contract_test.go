package offline

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestContract runs the one contract suite against every Store.
func TestContract(t *testing.T) {
	impls := []struct {
		name string
		// open opens a new store with the key (nil: none).
		open func(t *testing.T, key *Key) Store
		// rekey stands for a restart with another state key file (nil: none).
		rekey func(t *testing.T, s Store, key *Key) Store
	}{
		{"bolt", func(t *testing.T, key *Key) Store {
			s, _ := openTestStore(t, filepath.Join(t.TempDir(), "state.db"), Options{Key: key})
			return s
		}, func(t *testing.T, s Store, key *Key) Store {
			b := s.(*BoltStore)
			must(t, b.Close())
			reopened, _ := openTestStore(t, b.Path(), Options{Key: key})
			return reopened
		}},
		{"memory", func(t *testing.T, key *Key) Store {
			m := NewMemStore(func() time.Time { return t0 })
			m.SetKey(key)
			return m
		}, func(_ *testing.T, s Store, key *Key) Store {
			s.(*MemStore).SetKey(key)
			return s
		}},
	}
	for _, impl := range impls {
		t.Run(impl.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range contractCases {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					c.run(t, impl.open(t, testKey))
				})
			}
			for _, c := range keyCases {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					c.run(t, func(k *Key) Store { return impl.open(t, k) }, func(s Store, k *Key) Store { return impl.rekey(t, s, k) })
				})
			}
		})
	}
}

// keyCases are contract cases about the state key; rekey restarts the
// store with another key (nil: without one).
var keyCases = []struct {
	name string
	run  func(t *testing.T, open func(*Key) Store, rekey func(Store, *Key) Store)
}{
	{"SecretsAndTokensNeedAKey", testNeedAKey},
	{"KeyChangeIsMissingNotCorrupt", testKeyChange},
	{"RecordsKeptInTheClearAreSealedOnceAKeyIs", testSealedOnceAKeyIs},
	{"PodRecordRewrittenUnderANewKey", testPodRewrittenUnderNewKey},
}

// testSealedOnceAKeyIs: pods recorded while the store never had a key are readable, then
// sealed, once a key is configured (Open seals them); the same pod put again then writes
// nothing. From then on, without the key, a pod record is neither read nor written in the
// clear, and a pod record in the clear (planted on the disk) is refused.
func testSealedOnceAKeyIs(t *testing.T, open func(*Key) Store, rekey func(Store, *Key) Store) {
	s := open(nil)
	pod := testPod("u1", "p")
	must(t, s.PutPod(SourceAPI, pod))
	s = rekey(s, testKey)
	if rec, err := s.GetPod("u1"); err != nil || rec.Pod.Name != "p" {
		t.Fatalf("a pod kept in the clear, read with a key: %+v, %v", rec, err)
	}
	before := s.Stats()
	must(t, s.PutPod(SourceAPI, pod))
	if d := s.Stats(); d.Writes != before.Writes {
		t.Errorf("the same pod put again after its record was sealed wrote %d times", d.Writes-before.Writes)
	}
	// The key gone (an unreadable key file): nothing in the clear, nothing lost.
	s = rekey(s, nil)
	if _, err := s.GetPod("u1"); !errors.Is(err, ErrKeyMismatch) {
		t.Errorf("pod record once a key was configured, read without it: %v, want ErrKeyMismatch", err)
	}
	if err := s.PutPod(SourceAPI, testPod("u2", "q")); !errors.Is(err, ErrNoKey) {
		t.Errorf("a new pod put without the key the store's records are sealed with: %v, want ErrNoKey", err)
	}
	s = rekey(s, testKey)
	if rec, err := s.GetPod("u1"); err != nil || rec.Pod.Name != "p" {
		t.Errorf("the key back: %+v, %v", rec, err)
	}
}

// testPodRewrittenUnderNewKey: the apiserver gives again a pod whose record another key
// sealed; the record is replaced, sealed with the key there is now.
func testPodRewrittenUnderNewKey(t *testing.T, open func(*Key) Store, rekey func(Store, *Key) Store) {
	s := open(testKey)
	must(t, s.PutPod(SourceAPI, testPod("u1", "p")))
	must(t, s.SetAdmission("u1", Admission{Accepted: true, At: t0}))
	must(t, s.PutPod(SourceAPI, testPod("u2", "gone")))
	s = rekey(s, otherKey)
	must(t, s.PutPod(SourceAPI, testPod("u1", "p")))
	rec, err := s.GetPod("u1")
	if err != nil || rec.Pod.Name != "p" || !rec.Admission.Accepted {
		t.Fatalf("pod rewritten under the new key: %+v, %v", rec, err)
	}
	// Only a record still sealed with another key is deleted by DeletePodSealedWithAnotherKey.
	for uid, want := range map[types.UID]bool{"u1": false, "u2": true, "absent": false} {
		if deleted, err := s.DeletePodSealedWithAnotherKey(uid); err != nil || deleted != want {
			t.Errorf("DeletePodSealedWithAnotherKey(%s) = %v, %v; want %v", uid, deleted, err, want)
		}
	}
	if _, err := s.GetPod("u2"); !errors.Is(err, ErrNotFound) {
		t.Errorf("the record sealed with the old key after its deletion: %v", err)
	}
	if _, err := s.GetPod("u1"); err != nil {
		t.Errorf("the record written again: %v", err)
	}
	if q, _ := s.Quarantined(); len(q) != 0 {
		t.Errorf("quarantined: %+v", q)
	}
}

func testNeedAKey(t *testing.T, open func(*Key) Store, rekey func(Store, *Key) Store) {
	s := open(nil)
	must(t, s.PutPod(SourceAPI, testPod("u1", "p")))
	if err := s.PutSecret(&v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"}}); !errors.Is(err, ErrNoKey) {
		t.Errorf("PutSecret without a key: %v, want ErrNoKey", err)
	}
	if err := s.PutToken("u1", "t", Token{Token: "jwt"}); !errors.Is(err, ErrNoKey) {
		t.Errorf("PutToken without a key: %v, want ErrNoKey", err)
	}
	// ConfigMaps need none.
	must(t, s.PutConfigMap(&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}}))
}

func testKeyChange(t *testing.T, open func(*Key) Store, rekey func(Store, *Key) Store) {
	s := open(testKey)
	must(t, s.PutPod(SourceAPI, testPod("u1", "p")))
	must(t, s.PutSecret(&v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"}, Data: map[string][]byte{"k": []byte("v")}}))
	tok := Token{Token: "jwt-1", IssuedAt: t0, ExpiresAt: t0.Add(time.Hour)}
	must(t, s.PutToken("u1", "t", tok))

	for _, k := range []*Key{otherKey, nil} {
		s = rekey(s, k)
		if _, err := s.GetSecret("ns", "s"); !errors.Is(err, ErrKeyMismatch) {
			t.Errorf("GetSecret with key %v: %v, want ErrKeyMismatch", k, err)
		}
		if _, err := s.GetToken("u1", "t"); !errors.Is(err, ErrKeyMismatch) {
			t.Errorf("GetToken with key %v: %v, want ErrKeyMismatch", k, err)
		}
		// The pod record was sealed (its env values may be secrets): not restored, not lost.
		if _, err := s.GetPod("u1"); !errors.Is(err, ErrKeyMismatch) || errors.Is(err, ErrCorruptRecord) {
			t.Errorf("GetPod with key %v: %v, want ErrKeyMismatch only", k, err)
		}
		recs, errs, err := s.LoadPods()
		must(t, err)
		if len(recs) != 0 || len(errs) != 1 || !errors.Is(errs["u1"], ErrKeyMismatch) {
			t.Errorf("LoadPods with key %v: %v, %v", k, recs, errs)
		}
	}
	if q, _ := s.Quarantined(); len(q) != 0 {
		t.Errorf("a key change quarantined records: %+v", q)
	}
	// The right key back: nothing was lost.
	s = rekey(s, testKey)
	sec, err := s.GetSecret("ns", "s")
	must(t, err)
	if string(sec.Data["k"]) != "v" {
		t.Errorf("secret %+v", sec)
	}
	got, err := s.GetToken("u1", "t")
	must(t, err)
	if got.Token != tok.Token || !got.ExpiresAt.Equal(tok.ExpiresAt) {
		t.Errorf("token %+v, want %+v", got, tok)
	}
	if rec, err := s.GetPod("u1"); err != nil || rec.Pod.Name != "p" {
		t.Errorf("pod back with its key: %+v, %v", rec, err)
	}
	// A new key seals anew: a value written under it replaces the old one.
	s = rekey(s, otherKey)
	must(t, s.PutSecret(&v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"}, Data: map[string][]byte{"k": []byte("w")}}))
	if sec, err := s.GetSecret("ns", "s"); err != nil || string(sec.Data["k"]) != "w" {
		t.Errorf("secret rewritten under the new key: %+v, %v", sec, err)
	}
}

func testTokens(t *testing.T, s Store) {
	tok := Token{Token: "jwt-1", IssuedAt: t0, ExpiresAt: t0.Add(time.Hour)}
	if err := s.PutToken("u1", "default/aud/3607", tok); !errors.Is(err, ErrNotFound) {
		t.Errorf("token of an unrecorded pod: %v, want ErrNotFound", err)
	}
	must(t, s.PutPod(SourceAPI, testPod("u1", "p")))
	if _, err := s.GetToken("u1", "default/aud/3607"); !errors.Is(err, ErrNotFound) {
		t.Errorf("absent token: %v", err)
	}
	if err := s.PutToken("u1", "", tok); !errors.Is(err, ErrInvalid) {
		t.Errorf("token without a name: %v, want ErrInvalid", err)
	}
	must(t, s.PutToken("u1", "default/aud/3607", tok))
	before := s.Stats()
	must(t, s.PutToken("u1", "default/aud/3607", tok))
	if d := s.Stats(); d.Writes != before.Writes || d.SkippedWrites != before.SkippedWrites+1 {
		t.Errorf("unchanged token written again: %+v -> %+v", before, d)
	}
	got, err := s.GetToken("u1", "default/aud/3607")
	must(t, err)
	if got.Token != "jwt-1" || !got.IssuedAt.Equal(t0) || !got.ExpiresAt.Equal(tok.ExpiresAt) {
		t.Errorf("GetToken = %+v", got)
	}
	tok2 := tok
	tok2.Token = "jwt-2"
	must(t, s.PutToken("u1", "default/aud/3607", tok2))
	if got, _ := s.GetToken("u1", "default/aud/3607"); got.Token != "jwt-2" {
		t.Errorf("renewed token: %+v", got)
	}
	// Tokens do not disturb the pod record, and go with it.
	if rec, err := s.GetPod("u1"); err != nil || rec.Pod.Name != "p" {
		t.Errorf("pod with a token: %+v, %v", rec, err)
	}
	must(t, s.DeletePod("u1"))
	must(t, s.PutPod(SourceAPI, testPod("u1", "p")))
	if _, err := s.GetToken("u1", "default/aud/3607"); !errors.Is(err, ErrNotFound) {
		t.Errorf("token after its pod was deleted: %v", err)
	}
}

func testQuarantineToken(t *testing.T, s Store) {
	must(t, s.PutPod(SourceAPI, testPod("u1", "p")))
	must(t, s.PutToken("u1", "t", Token{Token: "jwt"}))
	s.(corrupter).corruptRecord(t, "token", "u1/t", garbage)
	if _, err := s.GetToken("u1", "t"); !errors.Is(err, ErrCorruptRecord) {
		t.Errorf("corrupt token: %v, want ErrCorruptRecord", err)
	}
	if _, err := s.GetToken("u1", "t"); !errors.Is(err, ErrNotFound) {
		t.Errorf("corrupt token read again: %v, want ErrNotFound", err)
	}
	q, _ := s.Quarantined()
	if len(q) != 1 || q[0].Key != "pods/u1/tokens/t" {
		t.Errorf("quarantine %+v", q)
	}
	if _, err := s.GetPod("u1"); err != nil {
		t.Errorf("the pod went with its token: %v", err)
	}
}

var contractCases = []struct {
	name string
	run  func(t *testing.T, s Store)
}{
	{"PodRoundTrip", testPodRoundTrip},
	{"Allocations", testAllocations},
	{"WritesByBucket", testWritesByBucket},
	{"PutPodRejectsInvalid", testPutPodRejectsInvalid},
	{"PutPodKeepsAdmissionAndTokens", testPutPodKeeps},
	{"AdmissionIsDecidedOnce", testAdmissionOnce},
	{"DeletePod", testDeletePod},
	{"SkipsUnchangedWrites", testSkipUnchanged},
	{"ConfigMapsAndSecrets", testObjects},
	{"Tokens", testTokens},
	{"QuarantineToken", testQuarantineToken},
	{"OutboxOrderCoalesceAck", testOutbox},
	{"OutboxBoundedOffline", testOutboxBounded},
	{"QuarantinePodRecords", testQuarantinePods},
	{"QuarantineOtherRecords", testQuarantineOthers},
	{"CopiesInAndOut", testCopies},
	{"PolicyModules", testPolicyModules},
	{"Closed", testClosed},
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func testPodRoundTrip(t *testing.T, s Store) {
	pod := testPod("uid-1", "web")
	must(t, s.PutPod(SourceAPI, pod))
	got, err := s.GetPod("uid-1")
	must(t, err)
	if got.UID != "uid-1" || got.Source != SourceAPI || got.Admission.Decided() {
		t.Errorf("GetPod = %+v", got)
	}
	if !equality.Semantic.DeepEqual(got.Pod, pod) {
		t.Errorf("pod changed in the round trip:\n got %+v\nwant %+v", got.Pod, pod)
	}
	must(t, s.PutPod(SourceFile, testPod("uid-0", "static")))
	recs, errs, err := s.LoadPods()
	must(t, err)
	if len(errs) != 0 {
		t.Errorf("LoadPods errors: %v", errs)
	}
	if len(recs) != 2 || recs[0].UID != "uid-0" || recs[1].UID != "uid-1" || recs[0].Source != SourceFile {
		t.Errorf("LoadPods = %+v, want uid-0 (file), uid-1 (api)", recs)
	}
	if _, err := s.GetPod("nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetPod(absent) = %v, want ErrNotFound", err)
	}
}

func testPutPodRejectsInvalid(t *testing.T, s Store) {
	for name, put := range map[string]func() error{
		"nil":        func() error { return s.PutPod(SourceAPI, nil) },
		"no UID":     func() error { return s.PutPod(SourceAPI, testPod("", "x")) },
		"bad source": func() error { return s.PutPod("carrier-pigeon", testPod("u", "x")) },
	} {
		if err := put(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if err := s.SetAdmission("u", Admission{Accepted: true}); !errors.Is(err, ErrInvalid) {
		t.Errorf("admission without time: %v, want ErrInvalid", err)
	}
}

func testPutPodKeeps(t *testing.T, s Store) {
	pod := testPod("uid-1", "web")
	must(t, s.PutPod(SourceAPI, pod))
	must(t, s.SetAdmission("uid-1", Admission{Accepted: true, At: t0}))
	must(t, s.PutToken("uid-1", "t", Token{Token: "jwt-1"}))
	pod = pod.DeepCopy()
	pod.Labels["version"] = "2"
	pod.ResourceVersion = "101"
	must(t, s.PutPod(SourceAPI, pod))
	got, err := s.GetPod("uid-1")
	must(t, err)
	if got.Pod.Labels["version"] != "2" || !got.Admission.Accepted {
		t.Errorf("after update: %+v", got)
	}
	if tok, err := s.GetToken("uid-1", "t"); err != nil || tok.Token != "jwt-1" {
		t.Errorf("token after the pod's update: %+v, %v", tok, err)
	}
}

func testAdmissionOnce(t *testing.T, s Store) {
	if err := s.SetAdmission("uid-1", Admission{Accepted: true, At: t0}); !errors.Is(err, ErrNotFound) {
		t.Errorf("admission of an unknown pod: %v, want ErrNotFound", err)
	}
	must(t, s.PutPod(SourceAPI, testPod("uid-1", "web")))
	// A time in another zone is the same instant: stored in UTC.
	accepted := Admission{Accepted: true, At: t0.In(time.FixedZone("CET", 3600))}
	must(t, s.SetAdmission("uid-1", accepted))
	before := s.Stats()
	must(t, s.SetAdmission("uid-1", Admission{Accepted: true, At: t0}))
	if d := s.Stats().SkippedWrites - before.SkippedWrites; d != 1 {
		t.Errorf("same decision again: %d skipped writes, want 1", d)
	}
	rejected := Admission{Accepted: false, At: t0.Add(time.Hour), Reason: "OutOfcpu", Message: "Node didn't have enough resource: cpu"}
	if err := s.SetAdmission("uid-1", rejected); !errors.Is(err, ErrAdmissionDecided) {
		t.Errorf("re-judging an accepted pod: %v, want ErrAdmissionDecided", err)
	}
	got, err := s.GetPod("uid-1")
	must(t, err)
	if !got.Admission.Accepted || !got.Admission.At.Equal(t0) {
		t.Errorf("admission = %+v, want accepted at %s", got.Admission, t0)
	}
	// A rejection is a decision too.
	must(t, s.PutPod(SourceAPI, testPod("uid-2", "big")))
	must(t, s.SetAdmission("uid-2", rejected))
	got, err = s.GetPod("uid-2")
	must(t, err)
	if got.Admission != (Admission{Accepted: false, At: rejected.At, Reason: "OutOfcpu", Message: rejected.Message}) {
		t.Errorf("rejected admission = %+v", got.Admission)
	}
}

func testDeletePod(t *testing.T, s Store) {
	must(t, s.PutPod(SourceAPI, testPod("uid-1", "web")))
	must(t, s.SetAdmission("uid-1", Admission{Accepted: true, At: t0}))
	must(t, s.PutToken("uid-1", "t", Token{Token: "jwt"}))
	must(t, s.PutPod(SourceAPI, testPod("uid-2", "db")))
	must(t, s.DeletePod("uid-1"))
	if _, err := s.GetPod("uid-1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("deleted pod: %v", err)
	}
	must(t, s.DeletePod("uid-1")) // absent: no-op
	// Re-creating it starts with no admission and no tokens.
	must(t, s.PutPod(SourceAPI, testPod("uid-1", "web")))
	got, err := s.GetPod("uid-1")
	must(t, err)
	if got.Admission.Decided() {
		t.Errorf("re-created pod kept old state: %+v", got)
	}
	if _, err := s.GetToken("uid-1", "t"); !errors.Is(err, ErrNotFound) {
		t.Errorf("re-created pod kept its old token: %v", err)
	}
	recs, _, err := s.LoadPods()
	must(t, err)
	if len(recs) != 2 {
		t.Errorf("%d pods, want 2", len(recs))
	}
}

func testSkipUnchanged(t *testing.T, s Store) {
	pod := testPod("uid-1", "web")
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "cfg", ResourceVersion: "3"}, Data: map[string]string{"a": "1"}}
	sec := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "tok", ResourceVersion: "4"}, Data: map[string][]byte{"t": []byte("x")}}
	admission := Admission{Accepted: true, At: t0}
	tok := Token{Token: "jwt", IssuedAt: t0, ExpiresAt: t0.Add(time.Hour)}
	writes := []func() error{
		func() error { return s.PutPod(SourceAPI, pod) },
		func() error { return s.SetAdmission("uid-1", admission) },
		func() error { return s.PutToken("uid-1", "t", tok) },
		func() error { return s.PutConfigMap(cm) },
		func() error { return s.PutSecret(sec) },
		func() error { return s.PutPolicyModule("sha256:"+strings.Repeat("c", 64), []byte("\x00asm")) },
	}
	for round := range 3 {
		before := s.Stats()
		for _, w := range writes {
			must(t, w())
		}
		d := s.Stats()
		wrote, skipped, commits := d.Writes-before.Writes, d.SkippedWrites-before.SkippedWrites, d.Commits-before.Commits
		switch {
		case round == 0 && (wrote != uint64(len(writes)) || skipped != 0):
			t.Errorf("first round: %d written, %d skipped; want %d, 0", wrote, skipped, len(writes))
		case round > 0 && (wrote != 0 || skipped != uint64(len(writes)) || commits != 0):
			t.Errorf("round %d (unchanged): %d written, %d skipped, %d commits; want 0, %d, 0", round, wrote, skipped, commits, len(writes))
		}
	}
	// Equal content built anew (another object, another time zone) is
	// still byte-identical once encoded.
	before := s.Stats()
	must(t, s.PutPod(SourceAPI, pod.DeepCopy()))
	must(t, s.SetAdmission("uid-1", Admission{Accepted: true, At: t0.In(time.FixedZone("Y", 5*3600))}))
	if d := s.Stats(); d.Writes != before.Writes || d.SkippedWrites != before.SkippedWrites+2 {
		t.Errorf("equal values: stats %+v -> %+v, want 2 more skipped", before, d)
	}
	// A real change is written.
	pod2 := pod.DeepCopy()
	pod2.Labels["x"] = "y"
	must(t, s.PutPod(SourceAPI, pod2))
	must(t, s.DeleteConfigMap("default", "cfg"))
	must(t, s.DeleteConfigMap("default", "cfg"))
	if d := s.Stats(); d.Writes != before.Writes+2 || d.SkippedWrites != before.SkippedWrites+3 {
		t.Errorf("changes: stats %+v -> %+v, want 2 more written, 1 more skipped", before, d)
	}
}

func testObjects(t *testing.T, s Store) {
	for _, name := range []string{"b", "a"} {
		must(t, s.PutConfigMap(&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: "7"}, Data: map[string]string{"k": name}}))
		must(t, s.PutSecret(&v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: "8"}, Data: map[string][]byte{"k": []byte(name)}}))
	}
	cm, err := s.GetConfigMap("ns", "a")
	must(t, err)
	if cm.Data["k"] != "a" || cm.ResourceVersion != "7" {
		t.Errorf("GetConfigMap = %+v", cm)
	}
	sec, err := s.GetSecret("ns", "b")
	must(t, err)
	if string(sec.Data["k"]) != "b" || sec.ResourceVersion != "8" {
		t.Errorf("GetSecret = %+v", sec)
	}
	if cm, err := s.GetConfigMap("ns", "b"); err != nil || cm.Data["k"] != "b" {
		t.Errorf("GetConfigMap(ns/b) = %+v, %v", cm, err)
	}
	must(t, s.DeleteSecret("ns", "a"))
	if _, err := s.GetSecret("ns", "a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("deleted secret: %v", err)
	}
	if sec, err := s.GetSecret("ns", "b"); err != nil || string(sec.Data["k"]) != "b" {
		t.Errorf("the other secret after a delete: %+v, %v", sec, err)
	}
	if _, err := s.GetConfigMap("ns", "zz"); !errors.Is(err, ErrNotFound) {
		t.Errorf("absent configmap: %v", err)
	}
	if err := s.PutConfigMap(&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "a/b", Name: "c"}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("namespace with a slash: %v, want ErrInvalid", err)
	}
}

// testOutboxBounded: weeks offline with crash-looping pods (every restart a status change)
// leave two entries per pod in the outbox, the oldest pending and the latest, whatever the
// number of changes; the pending status is the latest and still says how late it is.
func testOutboxBounded(t *testing.T, s Store) {
	const changes = 3000
	for i := range changes {
		for _, uid := range []types.UID{"looping", "flapping"} {
			_, err := s.AppendStatus(StatusUpdate{
				UID: uid, Namespace: "default", Name: "pod-" + string(uid),
				Status: testStatus(v1.PodRunning, int32(i)), Timestamp: t0.Add(time.Duration(i) * 5 * time.Minute),
			})
			must(t, err)
		}
	}
	if n, err := s.OutboxLen(); err != nil || n != 4 {
		t.Errorf("OutboxLen after %d changes of 2 pods: %d, %v; want 4", changes, n, err)
	}
	if n := s.Stats().OutboxSuperseded; n != 2*(changes-2) {
		t.Errorf("OutboxSuperseded = %d, want %d", n, 2*(changes-2))
	}
	pending, errs, err := s.PendingStatuses()
	must(t, err)
	if len(errs) != 0 || len(pending) != 2 {
		t.Fatalf("pending %+v, errors %v", pending, errs)
	}
	for _, p := range pending {
		if rc := p.Status.ContainerStatuses[0].RestartCount; rc != changes-1 || !p.FirstTimestamp.Equal(t0) ||
			!p.Timestamp.Equal(t0.Add((changes-1)*5*time.Minute)) || p.Entries != 2 {
			t.Errorf("pending %s: restartCount %d, first %s, latest %s, entries %d; want %d, %s, %s, 2",
				p.UID, rc, p.FirstTimestamp, p.Timestamp, p.Entries, changes-1, t0, t0.Add((changes-1)*5*time.Minute))
		}
		must(t, s.AckStatuses(p.UID, p.LastSeq))
	}
	if n, err := s.OutboxLen(); err != nil || n != 0 {
		t.Errorf("OutboxLen after delivery: %d, %v", n, err)
	}
}

func testOutbox(t *testing.T, s Store) {
	pending, errs, err := s.PendingStatuses()
	must(t, err)
	if len(pending) != 0 || len(errs) != 0 {
		t.Fatalf("empty outbox: %v %v", pending, errs)
	}
	type app struct {
		uid   types.UID
		phase v1.PodPhase
		at    time.Duration
	}
	var last uint64
	for i, a := range []app{
		{"a", v1.PodPending, 1}, {"b", v1.PodPending, 2}, {"a", v1.PodRunning, 3},
		{"c", v1.PodRunning, 4}, {"b", v1.PodFailed, 5}, {"a", v1.PodSucceeded, 6},
	} {
		seq, err := s.AppendStatus(StatusUpdate{
			UID: a.uid, Namespace: "default", Name: "pod-" + string(a.uid),
			Status: testStatus(a.phase, int32(i)), Timestamp: t0.Add(a.at * time.Minute),
		})
		must(t, err)
		if seq <= last {
			t.Fatalf("sequence %d after %d", seq, last)
		}
		last = seq
	}
	// a's Running (the second of its three) was superseded by its Succeeded: a pod keeps its
	// oldest pending entry and its latest.
	if n, err := s.OutboxLen(); err != nil || n != 5 {
		t.Errorf("OutboxLen after 6 appends: %d, %v; want 5", n, err)
	}
	if n := s.Stats().OutboxSuperseded; n != 1 {
		t.Errorf("OutboxSuperseded = %d, want 1", n)
	}
	pending, errs, err = s.PendingStatuses()
	must(t, err)
	if len(errs) != 0 {
		t.Errorf("errors: %v", errs)
	}
	type view struct {
		uid     types.UID
		phase   v1.PodPhase
		at, at0 time.Time
		n       int
	}
	var got []view
	for _, p := range pending {
		got = append(got, view{p.UID, p.Status.Phase, p.Timestamp, p.FirstTimestamp, p.Entries})
		if p.Name != "pod-"+string(p.UID) || p.FirstSeq > p.LastSeq {
			t.Errorf("pending %+v", p)
		}
	}
	want := []view{
		{"a", v1.PodSucceeded, t0.Add(6 * time.Minute), t0.Add(time.Minute), 2},
		{"b", v1.PodFailed, t0.Add(5 * time.Minute), t0.Add(2 * time.Minute), 2},
		{"c", v1.PodRunning, t0.Add(4 * time.Minute), t0.Add(4 * time.Minute), 1},
	}
	if len(got) != len(want) {
		t.Fatalf("pending = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].uid != want[i].uid || got[i].phase != want[i].phase || !got[i].at.Equal(want[i].at) ||
			!got[i].at0.Equal(want[i].at0) || got[i].n != want[i].n {
			t.Errorf("pending[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
	if rc := pending[0].Status.ContainerStatuses[0].RestartCount; rc != 5 {
		t.Errorf("latest status of a has restartCount %d, want 5", rc)
	}

	// Deliver a; meanwhile a gets a newer status: the ack leaves it.
	ackA := pending[0].LastSeq
	_, err = s.AppendStatus(StatusUpdate{UID: "a", Namespace: "default", Name: "pod-a", Status: testStatus(v1.PodRunning, 9), Timestamp: t0.Add(7 * time.Minute)})
	must(t, err)
	must(t, s.AckStatuses("a", ackA))
	// Acking b only up to its first entry leaves its second.
	must(t, s.AckStatuses("b", pending[1].FirstSeq))
	before := s.Stats()
	must(t, s.AckStatuses("nobody", 1000))
	must(t, s.AckStatuses("c", 0))
	if d := s.Stats(); d.Writes != before.Writes {
		t.Errorf("acks of nothing wrote: %+v -> %+v", before, d)
	}
	pending, _, err = s.PendingStatuses()
	must(t, err)
	// Left: c@4, b@5 (its first entry acked), a@7.
	if n, err := s.OutboxLen(); err != nil || n != 3 {
		t.Errorf("OutboxLen after acks: %d, %v; want 3", n, err)
	}
	if len(pending) != 3 || pending[0].UID != "c" || pending[1].UID != "b" || pending[1].Entries != 1 ||
		pending[1].Status.Phase != v1.PodFailed || pending[2].UID != "a" || pending[2].Entries != 1 ||
		pending[2].Status.ContainerStatuses[0].RestartCount != 9 {
		t.Errorf("after acks: %+v", pending)
	}
	for _, p := range pending {
		must(t, s.AckStatuses(p.UID, p.LastSeq))
	}
	pending, _, err = s.PendingStatuses()
	must(t, err)
	if len(pending) != 0 {
		t.Errorf("after acking all: %+v", pending)
	}
	if n, err := s.OutboxLen(); err != nil || n != 0 {
		t.Errorf("OutboxLen after acking all: %d, %v; want 0", n, err)
	}
	// Sequence numbers keep increasing after the outbox emptied.
	seq, err := s.AppendStatus(StatusUpdate{UID: "d", Status: testStatus(v1.PodRunning, 0), Timestamp: t0})
	must(t, err)
	if seq <= last+1 {
		t.Errorf("sequence %d reused (last was %d)", seq, last+1)
	}
	if _, err := s.AppendStatus(StatusUpdate{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("status without UID: %v", err)
	}
}

func testQuarantinePods(t *testing.T, s Store) {
	cr := s.(corrupter)
	for i := range 4 {
		uid := fmt.Sprintf("uid-%d", i)
		must(t, s.PutPod(SourceAPI, testPod(uid, "p"+uid)))
		must(t, s.SetAdmission(types.UID(uid), Admission{Accepted: true, At: t0}))
		must(t, s.PutToken(types.UID(uid), "t", Token{Token: "jwt-" + uid}))
	}
	cr.corruptRecord(t, "pod", "uid-0", garbage)
	cr.corruptRecord(t, "admission", "uid-1", garbage)
	// Valid framing, valid JSON, but an admission that was never decided.
	undecided, _ := encodeValue(Admission{Accepted: true})
	cr.corruptRecord(t, "admission", "uid-3", undecided)

	recs, errs, err := s.LoadPods()
	must(t, err)
	var uids []string
	for _, r := range recs {
		uids = append(uids, string(r.UID))
	}
	if !slices.Equal(uids, []string{"uid-2"}) {
		t.Errorf("good pods = %v, want [uid-2]", uids)
	}
	for _, k := range []string{"uid-0", "uid-1", "uid-3"} {
		if !errors.Is(errs[k], errUndecodable) {
			t.Errorf("errs[%s] = %v", k, errs[k])
		}
	}
	if len(errs) != 3 {
		t.Errorf("errs = %v", errs)
	}
	q, err := s.Quarantined()
	must(t, err)
	keys := map[string]QuarantinedRecord{}
	for _, r := range q {
		keys[r.Key] = r
	}
	for _, k := range []string{"pods/uid-0/pod", "pods/uid-1/admission", "pods/uid-3/admission"} {
		if _, ok := keys[k]; !ok {
			t.Errorf("quarantine lacks %s; has %v", k, slices.Sorted(maps.Keys(keys)))
		}
	}
	if r := keys["pods/uid-0/pod"]; string(r.Value) != string(garbage) || r.Reason == "" || r.At.IsZero() {
		t.Errorf("quarantined pod record = %+v", r)
	}
	// The whole of pod uid-0 went, its good parts kept for inspection too.
	for _, k := range []string{"pods/uid-0/admission", "pods/uid-0/tokens/t"} {
		if _, ok := keys[k]; !ok {
			t.Errorf("the good part %s of a quarantined pod was not kept", k)
		}
	}
	if st := s.Stats(); st.Quarantined < 3 {
		t.Errorf("Stats.Quarantined = %d", st.Quarantined)
	}
	// Quarantined records are gone, tokens with their pod: the next load is clean.
	recs, errs, err = s.LoadPods()
	must(t, err)
	if len(recs) != 1 || len(errs) != 0 {
		t.Errorf("second load: %d pods, errs %v", len(recs), errs)
	}
	if _, err := s.GetToken("uid-0", "t"); !errors.Is(err, ErrNotFound) {
		t.Errorf("token of a quarantined pod: %v, want ErrNotFound", err)
	}
	// GetPod quarantines too.
	cr.corruptRecord(t, "admission", "uid-2", garbage)
	if _, err := s.GetPod("uid-2"); !errors.Is(err, ErrCorruptRecord) {
		t.Errorf("GetPod with a bad admission: %v, want ErrCorruptRecord", err)
	}
	if _, err := s.GetPod("uid-2"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetPod after quarantine: %v, want ErrNotFound", err)
	}
}

func testQuarantineOthers(t *testing.T, s Store) {
	cr := s.(corrupter)
	for _, n := range []string{"a", "b"} {
		must(t, s.PutConfigMap(&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: n}}))
		must(t, s.PutSecret(&v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: n}}))
	}
	cr.corruptRecord(t, "configmap", "ns/a", garbage)
	if _, err := s.GetConfigMap("ns", "a"); !errors.Is(err, ErrCorruptRecord) {
		t.Errorf("GetConfigMap(bad) = %v, want ErrCorruptRecord", err)
	}
	if _, err := s.GetConfigMap("ns", "a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetConfigMap after quarantine = %v, want ErrNotFound", err)
	}
	if cm, err := s.GetConfigMap("ns", "b"); err != nil || cm.Name != "b" {
		t.Errorf("the good ConfigMap: %+v, %v", cm, err)
	}
	// A secret stored under the wrong key is as bad as garbage.
	moved, _ := encodeValue(&v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"}})
	cr.corruptRecord(t, "secret", "ns/b", moved)
	if _, err := s.GetSecret("ns", "b"); !errors.Is(err, ErrCorruptRecord) {
		t.Errorf("GetSecret(bad) = %v, want ErrCorruptRecord", err)
	}
	if _, err := s.GetSecret("ns", "b"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetSecret after quarantine = %v, want ErrNotFound", err)
	}

	q, err := s.Quarantined()
	must(t, err)
	var keys []string
	for _, r := range q {
		keys = append(keys, r.Key)
	}
	want := []string{"configmaps/ns/a", "secrets/ns/b"}
	if !slices.Equal(keys, want) {
		t.Errorf("quarantine keys = %v, want %v", keys, want)
	}
	for i := 1; i < len(q); i++ {
		if q[i].Seq <= q[i-1].Seq {
			t.Errorf("quarantine not in order: %v", keys)
		}
	}
}

func testCopies(t *testing.T, s Store) {
	pod := testPod("uid-1", "web")
	must(t, s.PutPod(SourceAPI, pod))
	pod.Labels["app"] = "changed after put"
	got, err := s.GetPod("uid-1")
	must(t, err)
	if got.Pod.Labels["app"] != "web" {
		t.Errorf("store saw a mutation made after PutPod")
	}
	got.Pod.Labels["app"] = "changed after get"
	again, err := s.GetPod("uid-1")
	must(t, err)
	if again.Pod.Labels["app"] != "web" {
		t.Errorf("store saw a mutation of a returned pod")
	}
}

func testClosed(t *testing.T, s Store) {
	must(t, s.PutPod(SourceAPI, testPod("uid-1", "web")))
	must(t, s.Close())
	if err := s.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
	checks := map[string]error{
		"PutPod": s.PutPod(SourceAPI, testPod("uid-2", "x")),
		"GetPod": func() error { _, err := s.GetPod("uid-1"); return err }(),
		"Load":   func() error { _, _, err := s.LoadPods(); return err }(),
		"Append": func() error { _, err := s.AppendStatus(StatusUpdate{UID: "u"}); return err }(),
		"Token":  func() error { _, err := s.GetToken("uid-1", "t"); return err }(),
		"Secret": s.PutSecret(&v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"}}),
	}
	for name, err := range checks {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
}

// testWritesByBucket: each changing write is counted under the top-level bucket of its record
// (what holdfast_store_writes_total{bucket} reports); a skipped one is not.
func testWritesByBucket(t *testing.T, s Store) {
	before := s.Stats()
	must(t, s.PutPod(SourceAPI, testPod("u1", "p")))
	must(t, s.PutPod(SourceAPI, testPod("u1", "p"))) // unchanged: skipped
	must(t, s.SetAdmission("u1", Admission{Accepted: true, At: t0}))
	_, err := s.AppendStatus(StatusUpdate{UID: "u1", Namespace: "default", Name: "p", Status: testStatus(v1.PodRunning, 0), Timestamp: t0})
	must(t, err)
	must(t, s.PutConfigMap(&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}}))
	must(t, s.DeleteConfigMap("ns", "c"))
	after := s.Stats()
	for bucket, want := range map[string]uint64{"pods": 2, "outbox": 1, "configmaps": 2} {
		if d := after.WritesByBucket[bucket] - before.WritesByBucket[bucket]; d != want {
			t.Errorf("writes to %s: %d, want %d (stats %+v)", bucket, d, want, after.WritesByBucket)
		}
	}
	if d := after.Writes - before.Writes; d != 5 {
		t.Errorf("writes: %d, want 5", d)
	}
}

func testPolicyModules(t *testing.T, s Store) {
	digestA := "sha256:" + strings.Repeat("a", 64)
	digestB := "sha256:" + strings.Repeat("b", 64)
	if _, err := s.GetPolicyModule(digestA); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetPolicyModule before any put: %v, want ErrNotFound", err)
	}
	if got, err := s.PolicyModules(); err != nil || len(got) != 0 {
		t.Fatalf("PolicyModules of an empty store = %v, %v", got, err)
	}
	for _, bad := range []string{"", "sha256:abc", "sha512:" + strings.Repeat("a", 128), "sha256:" + strings.Repeat("A", 64), "latest"} {
		if err := s.PutPolicyModule(bad, []byte("x")); !errors.Is(err, ErrInvalid) {
			t.Errorf("PutPolicyModule(%q): %v, want ErrInvalid", bad, err)
		}
	}
	moduleA := []byte("\x00asm\x01\x00\x00\x00 module A")
	must(t, s.PutPolicyModule(digestA, moduleA))
	must(t, s.PutPolicyModule(digestB, []byte("\x00asm module B")))
	moduleA[0] = 'X' // the store keeps its own copy
	got, err := s.GetPolicyModule(digestA)
	must(t, err)
	if string(got) != "\x00asm\x01\x00\x00\x00 module A" {
		t.Errorf("GetPolicyModule = %q", got)
	}
	skipped := s.Stats().SkippedWrites
	must(t, s.PutPolicyModule(digestA, got))
	if s.Stats().SkippedWrites != skipped+1 {
		t.Errorf("an unchanged module was written again")
	}
	if list, err := s.PolicyModules(); err != nil || !slices.Equal(list, []string{digestA, digestB}) {
		t.Errorf("PolicyModules = %v, %v", list, err)
	}
	must(t, s.DeletePolicyModule(digestB))
	must(t, s.DeletePolicyModule(digestB)) // absent: a no-op
	if list, _ := s.PolicyModules(); !slices.Equal(list, []string{digestA}) {
		t.Errorf("PolicyModules after delete = %v", list)
	}

	// Bit rot in a module: quarantined, reported, then missing (the agent pulls it again).
	s.(corrupter).corruptRecord(t, "policymodule", digestA, garbage)
	if _, err := s.GetPolicyModule(digestA); !errors.Is(err, ErrCorruptRecord) {
		t.Fatalf("GetPolicyModule of a damaged module: %v, want ErrCorruptRecord", err)
	}
	if _, err := s.GetPolicyModule(digestA); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetPolicyModule after quarantine: %v, want ErrNotFound", err)
	}
	q, err := s.Quarantined()
	must(t, err)
	if len(q) != 1 || q[0].Key != "policy_modules/"+digestA {
		t.Errorf("Quarantined = %+v", q)
	}
}
