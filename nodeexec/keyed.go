package nodeexec

import gosync "sync"

// KeyedMutex is a mutex per key (drivers serialise the work on one
// instance or volume with it), freed when nobody holds or waits for it.
// The zero value is ready to use.
type KeyedMutex struct {
	mu gosync.Mutex
	m  map[string]*keyedEntry
}

type keyedEntry struct {
	mu   gosync.Mutex
	refs int
}

// Lock locks key and returns the function that unlocks it.
func (k *KeyedMutex) Lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyedEntry{}
	}
	e := k.m[key]
	if e == nil {
		e = &keyedEntry{}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}
