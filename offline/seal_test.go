package offline

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// secretsAUserKeeps are values a pod carries as users write pods: an inline env value, the
// same in kubectl's last-applied annotation, a ConfigMap's data, a Secret's.
const (
	inlineEnvValue = "inline-env-hunter2"
	configMapValue = "configmap-hunter2"
	secretValue    = "secret-hunter2"
)

// putWhatAUserKeeps records a pod with an inline env value (and kubectl's annotation that
// repeats it), a ConfigMap and a Secret.
func putWhatAUserKeeps(t *testing.T, s *BoltStore) {
	t.Helper()
	pod := testPod("u1", "db")
	pod.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"env":[{"name":"PASSWORD","value":"` + inlineEnvValue + `"}]}`}
	pod.Spec.Containers[0].Env = []v1.EnvVar{{Name: "PASSWORD", Value: inlineEnvValue}}
	must(t, s.PutPod(SourceAPI, pod))
	must(t, s.PutConfigMap(&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cfg"}, Data: map[string]string{"dsn": configMapValue}}))
	if s.seal.key != nil {
		must(t, s.PutSecret(&v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"}, Data: map[string][]byte{"k": []byte(secretValue)}}))
	}
}

// stolenFile reads the database file as whoever took the disk does: every byte of it.
func stolenFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestStolenDiskHoldsNoSecretInTheClear is the attack of a stolen disk on a gateway with a
// state key: the file, read byte by byte, holds no inline env value, no Secret and, where
// asked (SealConfigMaps), no ConfigMap value. Without SealConfigMaps, ConfigMaps stay in the
// clear, as documented; without a key, everything but Secrets (never stored then) does.
func TestStolenDiskHoldsNoSecretInTheClear(t *testing.T) {
	for _, c := range []struct {
		name      string
		opts      Options
		readable  []string // what the thief reads
		protected []string // what the thief does not
	}{
		{"key, ConfigMaps sealed", Options{Key: testKey, SealConfigMaps: true}, nil, []string{inlineEnvValue, configMapValue, secretValue}},
		{"key", Options{Key: testKey}, []string{configMapValue}, []string{inlineEnvValue, secretValue}},
		{"no key", Options{}, []string{inlineEnvValue, configMapValue}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.db")
			s, _ := openTestStore(t, path, c.opts)
			putWhatAUserKeeps(t, s)
			// Read back through the store: sealing loses nothing.
			if rec, err := s.GetPod("u1"); err != nil || rec.Pod.Spec.Containers[0].Env[0].Value != inlineEnvValue {
				t.Fatalf("pod read back: %+v, %v", rec, err)
			}
			if cm, err := s.GetConfigMap("ns", "cfg"); err != nil || cm.Data["dsn"] != configMapValue {
				t.Fatalf("ConfigMap read back: %+v, %v", cm, err)
			}
			must(t, s.Close())
			disk := stolenFile(t, path)
			for _, v := range c.protected {
				if bytes.Contains(disk, []byte(v)) {
					t.Errorf("%q is in the clear in the database file", v)
				}
			}
			for _, v := range c.readable {
				if !bytes.Contains(disk, []byte(v)) {
					t.Errorf("%q not found in the file: the test no longer reads what it thinks", v)
				}
			}
		})
	}
}

// TestKeyConfiguredLaterSealsWhatWasInTheClear: a gateway that ran without a key, then got
// one: Open seals the pod records and ConfigMaps kept in the clear, says so in its report, and
// the next boot finds nothing left to seal (and writes nothing for it).
func TestKeyConfiguredLaterSealsWhatWasInTheClear(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, _ := openTestStore(t, path, Options{})
	putWhatAUserKeeps(t, s)
	must(t, s.Close())

	s, rep := openTestStore(t, path, Options{Key: testKey, SealConfigMaps: true})
	if rep.Sealed != 2 {
		t.Errorf("report.Sealed = %d, want 2 (the pod record and the ConfigMap): %s", rep.Sealed, rep)
	}
	if rec, err := s.GetPod("u1"); err != nil || rec.Pod.Spec.Containers[0].Env[0].Value != inlineEnvValue {
		t.Fatalf("pod read back: %+v, %v", rec, err)
	}
	must(t, s.Close())

	s, rep = openTestStore(t, path, Options{Key: testKey, SealConfigMaps: true})
	if rep.Sealed != 0 || s.Stats().Commits != 0 {
		t.Errorf("second boot with the key: sealed %d, %d commits; want nothing written", rep.Sealed, s.Stats().Commits)
	}
	// The records are sealed: without the key, neither reads.
	must(t, s.Close())
	s, _ = openTestStore(t, path, Options{})
	if _, err := s.GetPod("u1"); err == nil {
		t.Error("the pod record reads without the key")
	}
	if _, err := s.GetConfigMap("ns", "cfg"); err == nil {
		t.Error("the ConfigMap reads without the key")
	}
	must(t, s.Close())
}

// Whoever can write the disk plants a pod record in the clear (a privileged pod mounting the
// host) in a database whose pod records are sealed. It is refused and quarantined, never
// restored, and Open does not seal it, which would hide it among the agent's own records.
// Before, a record in the clear was read whatever the key, and sealed by the next Open.
func TestPlantedPodRecordRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, _ := openTestStore(t, path, Options{Key: testKey})
	must(t, s.PutPod(SourceAPI, testPod("u1", "web")))
	must(t, s.Close())

	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	planted := testPod("evil", "evil")
	raw, err := encodeValue(podEntry{Source: SourceFile, Pod: planted})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.Bucket(bucketPods).CreateBucket([]byte("evil"))
		if err != nil {
			return err
		}
		return b.Put(keyPod, raw)
	}); err != nil {
		t.Fatal(err)
	}
	must(t, db.Close())

	s, rep := openTestStore(t, path, Options{Key: testKey})
	if rep.Sealed != 0 {
		t.Errorf("Open sealed %d records: the planted one would pass for the agent's", rep.Sealed)
	}
	recs, bad, err := s.LoadPods()
	must(t, err)
	if len(recs) != 1 || recs[0].UID != "u1" {
		t.Errorf("pods loaded: %+v, want u1 alone", recs)
	}
	if !errors.Is(bad["evil"], errUndecodable) {
		t.Errorf("the planted record: %v, want it refused as undecodable", bad["evil"])
	}
	if q, _ := s.Quarantined(); len(q) != 1 || q[0].Key != "pods/evil/pod" {
		t.Errorf("quarantined: %+v", q)
	}
	must(t, s.Close())
}

// A database whose pod records are sealed, opened without the key (the key file unreadable):
// Open says so, records sealed with the key are reported without a write transaction (nothing
// is quarantined, the flash is not written at every read), and no pod record is written in
// the clear.
func TestKeyMissingKeepsNothingInTheClear(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, _ := openTestStore(t, path, Options{Key: testKey})
	must(t, s.PutPod(SourceAPI, testPod("u1", "web")))
	must(t, s.Close())

	s, rep := openTestStore(t, path, Options{})
	if rep.KeyMissing != testKey.ID() || !strings.Contains(rep.String(), "not loaded") {
		t.Errorf("report: %+v (%s); want the missing key named", rep, rep)
	}
	before := s.Stats().Commits
	recs, bad, err := s.LoadPods()
	must(t, err)
	if len(recs) != 0 || !errors.Is(bad["u1"], ErrKeyMismatch) {
		t.Errorf("LoadPods without the key: %+v, %v", recs, bad)
	}
	if n := s.Stats().Commits - before; n != 0 {
		t.Errorf("reading records sealed with another key cost %d commits", n)
	}
	pod := testPod("u2", "db")
	pod.Spec.Containers[0].Env = []v1.EnvVar{{Name: "PASSWORD", Value: inlineEnvValue}}
	if err := s.PutPod(SourceAPI, pod); !errors.Is(err, ErrNoKey) {
		t.Errorf("PutPod without the key: %v, want ErrNoKey", err)
	}
	must(t, s.Close())
	if bytes.Contains(stolenFile(t, path), []byte(inlineEnvValue)) {
		t.Error("the inline env value reached the file in the clear")
	}
}
