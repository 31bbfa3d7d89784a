// Command genv2db writes a state database of schema v2 (drawn in
// offline/doc.go), the schema before Secrets were encrypted and tokens kept,
// for the migration test. It stands in for the holdfast that wrote such
// files: keep it writing exactly v2, never the current schema.
//
// Regenerate the committed file with:
//
//	go run ./offline/internal/genv2db -out offline/testdata/schema-v2.db
package main

import (
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"hash/crc32"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func main() {
	out := flag.String("out", "offline/testdata/schema-v2.db", "file to write (replaced)")
	flag.Parse()
	if err := write(*out); err != nil {
		fmt.Fprintln(os.Stderr, "genv2db:", err)
		os.Exit(1)
	}
}

// frame is v2's value framing: CRC-32C (big-endian) then the JSON.
func frame(v any) ([]byte, error) {
	payload, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	out := binary.BigEndian.AppendUint32(nil, crc32.Checksum(payload, crc32.MakeTable(crc32.Castagnoli)))
	return append(out, payload...), nil
}

const uid = "6f1b6a3e-0000-4000-8000-000000000003"

var at = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

func write(path string) error {
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return err
	}
	defer db.Close()
	return db.Update(func(tx *bolt.Tx) error {
		bucket := func(path ...string) (*bolt.Bucket, error) {
			b, err := tx.CreateBucketIfNotExists([]byte(path[0]))
			for _, p := range path[1:] {
				if err != nil {
					break
				}
				b, err = b.CreateBucketIfNotExists([]byte(p))
			}
			return b, err
		}
		put := func(key string, v any, path ...string) error {
			b, err := bucket(path...)
			if err != nil {
				return err
			}
			raw, ok := v.([]byte)
			if !ok {
				if raw, err = frame(v); err != nil {
					return err
				}
			}
			return b.Put([]byte(key), raw)
		}
		pod := &v1.Pod{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "meter", UID: types.UID(uid), ResourceVersion: "51"},
			Spec: v1.PodSpec{NodeName: "gw-02", Containers: []v1.Container{{
				Name: "app", Image: "docker.io/local/busybox:1", Command: []string{"sleep", "3600"},
			}}},
		}
		for _, b := range []string{"meta", "pods", "sync", "configmaps", "secrets", "node", "outbox", "outbox_index", "quarantine"} {
			if _, err := bucket(b); err != nil {
				return err
			}
		}
		steps := []error{
			put("version", []byte("2"), "meta"),
			put("node_name", []byte("gw-02"), "meta"),
			put("boot_count", binary.BigEndian.AppendUint64(nil, 7), "meta"),
			put("pod", map[string]any{"source": "api", "pod": pod}, "pods", uid),
			put("admission", map[string]any{"accepted": true, "at": at}, "pods", uid),
			put("app", map[string]any{"name": "app", "containerID": "c-app-2", "attempt": 2, "restartCount": 2}, "pods", uid, "containers"),
			put("pods_resource_version", "1234", "sync"),
			put("default/meter-config", &v1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "meter-config", ResourceVersion: "27"},
				Data:       map[string]string{"interval": "10s"},
			}, "configmaps"),
			// v2 kept Secrets in the clear (only with PersistSecrets).
			put("default/meter-secret", &v1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "meter-secret", ResourceVersion: "28"},
				Data:       map[string][]byte{"password": []byte("pl41n")},
			}, "secrets"),
			put("node", &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gw-02", ResourceVersion: "199"}}, "node"),
		}
		for _, err := range steps {
			if err != nil {
				return err
			}
		}
		return nil
	})
}
