/*
 * nodecache: one node's client cache of a shared file system, as a FUSE file system.
 *
 *     nodecache BACKING MOUNTPOINT [-f] [fuse options]
 *
 * It models what a parallel file system client (Lustre, GPFS) does with a node's
 * writes: data written through this mount stays in this process's memory (the
 * node's cache), byte for byte, until the file is fsync'd (or fdatasync'd) through
 * this mount, which writes this node's dirty bytes of that file to BACKING and
 * fsyncs them there. What other nodes fsync'd is visible here at once (reads go to
 * BACKING, with this node's dirty bytes laid over them; sizes are the larger of the
 * two), as on a coherent client. Killing this process (the node losing power)
 * loses every unsynced byte of this node and nothing of any other node.
 *
 * Metadata operations (create, mkdir, rename, unlink, truncate, chmod) go straight
 * to BACKING, as in LazyFS: lost renames are not modelled. Directory entries are cached
 * as on MooseFS or NFS clients (NODECACHE_DENTRY_TTL seconds, default 1): a directory
 * this node looked up is found under that name for that long, even after another node
 * renamed it away and made a new one of the name.
 *
 * Faults: while the file named by the environment variable NODECACHE_FAIL_WRITES
 * exists, every write and fsync through this mount fails with EIO (a failing disk or
 * OST); reads and metadata operations go on. Stopping this process (SIGSTOP) makes
 * every operation through the mount wait in the kernel until it is continued, as a
 * stuck OST does. Written for the hpckpt lab
 * (tests/lab) because LazyFS's cache is not coherent between mounts of one backing
 * directory (docs/lab.md).
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

static int backing = -1; /* descriptor of the backing directory */
static const char *fail_writes = NULL; /* while this file exists, writes and fsyncs fail with EIO */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* One dirty byte range of one file, kept sorted and disjoint per file. */
struct extent {
    off_t start;
    size_t length;
    char *bytes;
    struct extent *next;
};

/* The dirty bytes of one backing file, keyed by its inode and birth time (renames keep
 * them; an inode number reused after another node removed the file does not match). */
struct dirty {
    ino_t ino;
    dev_t dev;
    struct timespec born;
    struct extent *extents;
    struct dirty *next;
};

static struct dirty *files = NULL;

/* The node's cache of directory entries, as the clients of MooseFS (mfsdirentrycacheto)
 * and NFS keep one: for NODECACHE_DENTRY_TTL seconds (default 1; 0: none) after this node
 * looked a directory up, its name leads to the directory it found then, even when
 * another node has renamed that directory away and put a new one under the name since.
 * This node's own renames, mkdirs and rmdirs update its cache, as the kernel does. */
#define DENTRIES 1024
struct dentry {
    char path[PATH_MAX];
    ino_t ino;
    double at; /* 0: free */
};
static struct dentry dentries[DENTRIES];
static double dentry_ttl = 1.0;
static int next_dentry = 0;
static pthread_mutex_t dentry_lock = PTHREAD_MUTEX_INITIALIZER;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Whether path equals prefix or lies under it. */
static int under(const char *path, const char *prefix, size_t length) {
    return strncmp(path, prefix, length) == 0 && (path[length] == 0 || path[length] == '/');
}

/* Remember that directory path (as this node names it) is inode ino, unless a fresh entry
 * has it already (a cached entry expires; looking it up again does not renew it). */
static void remember(const char *path, ino_t ino) {
    if (dentry_ttl <= 0 || !*path || strlen(path) >= PATH_MAX) return;
    double fresh = now() - dentry_ttl;
    pthread_mutex_lock(&dentry_lock);
    struct dentry *slot = NULL;
    for (int i = 0; i < DENTRIES && !slot; i++)
        if (dentries[i].at && !strcmp(dentries[i].path, path)) slot = &dentries[i];
    if (slot && slot->at >= fresh) {
        pthread_mutex_unlock(&dentry_lock);
        return;
    }
    if (!slot) {
        slot = &dentries[next_dentry];
        next_dentry = (next_dentry + 1) % DENTRIES;
    }
    strcpy(slot->path, path);
    slot->ino = ino;
    slot->at = now();
    pthread_mutex_unlock(&dentry_lock);
}

/* This node's own change under path: entries at or under it are dropped, or (to) moved. */
static void moved(const char *path, const char *to) {
    size_t length = strlen(path);
    pthread_mutex_lock(&dentry_lock);
    for (int i = 0; i < DENTRIES; i++) {
        struct dentry *d = &dentries[i];
        if (!d->at) continue;
        if (to && under(d->path, to, strlen(to))) d->at = 0; /* replaced by the rename */
        else if (under(d->path, path, length)) {
            if (to && strlen(to) + strlen(d->path) - length < PATH_MAX) {
                char rest[PATH_MAX];
                strcpy(rest, d->path + length);
                snprintf(d->path, PATH_MAX, "%s%s", to, rest);
            } else d->at = 0;
        }
    }
    pthread_mutex_unlock(&dentry_lock);
}

/* The backing path of path: the longest cached directory on it that another node renamed
 * away is followed to its new name in the same parent (where the name now leads elsewhere). */
static const char *rel(const char *path) {
    const char *plain = path[1] ? path + 1 : ".";
    if (dentry_ttl <= 0) return plain;
    static __thread char buffers[4][PATH_MAX];
    static __thread int turn = 0;
    char stale[PATH_MAX] = "";
    ino_t ino = 0;
    double fresh = now() - dentry_ttl;
    pthread_mutex_lock(&dentry_lock);
    for (int i = 0; i < DENTRIES; i++) {
        struct dentry *d = &dentries[i];
        size_t length = strlen(d->path);
        struct stat st;
        if (d->at < fresh || length <= strlen(stale) || !under(plain, d->path, length)) continue;
        if (fstatat(backing, d->path, &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_ino == d->ino) continue;
        strcpy(stale, d->path);
        ino = d->ino;
    }
    pthread_mutex_unlock(&dentry_lock);
    if (!*stale) return plain;
    char parent[PATH_MAX];
    strcpy(parent, stale);
    char *slash = strrchr(parent, '/');
    if (slash) *slash = 0;
    else strcpy(parent, ".");
    int fd = openat(backing, parent, O_RDONLY | O_DIRECTORY);
    DIR *dir = fd < 0 ? NULL : fdopendir(fd);
    if (!dir) {
        if (fd >= 0) close(fd);
        return plain;
    }
    char *out = buffers[turn];
    turn = (turn + 1) % 4;
    const char *found = NULL;
    struct dirent *entry;
    while ((entry = readdir(dir)))
        if (entry->d_ino == ino && strcmp(entry->d_name, ".") && strcmp(entry->d_name, "..")) {
            found = entry->d_name;
            break;
        }
    if (found)
        snprintf(out, PATH_MAX, "%s%s%s%s", slash ? parent : "", slash ? "/" : "", found, plain + strlen(stale));
    closedir(dir);
    return found ? out : plain;
}

/* The birth time of the open file fd (fd >= 0) or of path under the backing directory. */
static struct timespec birth(int fd, const char *path) {
    struct statx sx;
    struct timespec born = {0, 0};
    int res = fd >= 0 ? statx(fd, "", AT_EMPTY_PATH, STATX_BTIME, &sx)
                      : statx(backing, rel(path), AT_SYMLINK_NOFOLLOW, STATX_BTIME, &sx);
    if (res == 0 && (sx.stx_mask & STATX_BTIME)) {
        born.tv_sec = sx.stx_btime.tv_sec;
        born.tv_nsec = sx.stx_btime.tv_nsec;
    }
    return born;
}

static struct dirty *find(const struct stat *st, struct timespec born, int create) {
    for (struct dirty *d = files; d; d = d->next)
        if (d->ino == st->st_ino && d->dev == st->st_dev && d->born.tv_sec == born.tv_sec &&
            d->born.tv_nsec == born.tv_nsec)
            return d;
    if (!create) return NULL;
    struct dirty *d = calloc(1, sizeof *d);
    d->ino = st->st_ino;
    d->dev = st->st_dev;
    d->born = born;
    d->next = files;
    files = d;
    return d;
}

static void drop(struct dirty *victim) {
    for (struct dirty **p = &files; *p; p = &(*p)->next)
        if (*p == victim) {
            *p = victim->next;
            break;
        }
    for (struct extent *e = victim->extents, *n; e; e = n) {
        n = e->next;
        free(e->bytes);
        free(e);
    }
    free(victim);
}

static off_t dirty_end(const struct dirty *d) {
    off_t end = 0;
    for (const struct extent *e = d->extents; e; e = e->next)
        if (e->start + (off_t)e->length > end) end = e->start + (off_t)e->length;
    return end;
}

/* Cut every extent to [0, size). */
static void cut(struct dirty *d, off_t size) {
    for (struct extent **p = &d->extents; *p;) {
        struct extent *e = *p;
        if (e->start >= size) {
            *p = e->next;
            free(e->bytes);
            free(e);
            continue;
        }
        if (e->start + (off_t)e->length > size) e->length = (size_t)(size - e->start);
        p = &e->next;
    }
}

/* Record bytes [offset, offset + length) as dirty, merging with touching extents. */
static int add(struct dirty *d, const char *buf, size_t length, off_t offset) {
    off_t start = offset, end = offset + (off_t)length;
    /* A write that touches one extent only, starting inside or at its end (sequential
     * writes): grown in place, not copied whole again (that was quadratic). */
    struct extent *only = NULL;
    int touching = 0;
    for (struct extent *e = d->extents; e; e = e->next)
        if (e->start + (off_t)e->length >= offset && e->start <= end && touching++ == 0) only = e;
    if (touching == 1 && only->start <= offset) {
        off_t only_end = only->start + (off_t)only->length;
        if (end > only_end) {
            char *grown = realloc(only->bytes, (size_t)(end - only->start));
            if (!grown) return -ENOMEM;
            only->bytes = grown;
            only->length = (size_t)(end - only->start);
        }
        memcpy(only->bytes + (offset - only->start), buf, length);
        return 0;
    }
    for (struct extent *e = d->extents; e; e = e->next) {
        off_t e_end = e->start + (off_t)e->length;
        if (e_end >= offset && e->start <= offset + (off_t)length) {
            if (e->start < start) start = e->start;
            if (e_end > end) end = e_end;
        }
    }
    char *bytes = malloc((size_t)(end - start) ? (size_t)(end - start) : 1);
    if (!bytes) return -ENOMEM;
    struct extent **p = &d->extents;
    while (*p) {
        struct extent *e = *p;
        if (e->start >= start && e->start + (off_t)e->length <= end) {
            memcpy(bytes + (e->start - start), e->bytes, e->length);
            *p = e->next;
            free(e->bytes);
            free(e);
        } else {
            p = &e->next;
        }
    }
    memcpy(bytes + (offset - start), buf, length);
    struct extent *fresh = malloc(sizeof *fresh);
    fresh->start = start;
    fresh->length = (size_t)(end - start);
    fresh->bytes = bytes;
    p = &d->extents;
    while (*p && (*p)->start < start) p = &(*p)->next;
    fresh->next = *p;
    *p = fresh;
    return 0;
}

static int pwrite_all(int fd, const char *buf, size_t length, off_t offset) {
    while (length) {
        ssize_t done = pwrite(fd, buf, length, offset);
        if (done < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        buf += done;
        length -= (size_t)done;
        offset += done;
    }
    return 0;
}

/* Whether writes and fsyncs fail now (NODECACHE_FAIL_WRITES names an existing file). */
static int failing(void) { return fail_writes && access(fail_writes, F_OK) == 0; }

/* Write this node's dirty bytes of the file open as fd to the backing file, fsync it. */
static int sync_file(int fd, int datasync) {
    if (failing()) return -EIO;
    struct stat st;
    if (fstat(fd, &st) < 0) return -errno;
    struct timespec born = birth(fd, NULL);
    pthread_mutex_lock(&lock);
    struct dirty *d = find(&st, born, 0);
    int res = 0;
    if (d) {
        for (struct extent *e = d->extents; e && !res; e = e->next) res = pwrite_all(fd, e->bytes, e->length, e->start);
        if (!res) drop(d);
    }
    pthread_mutex_unlock(&lock);
    if (res) return res;
    return (datasync ? fdatasync(fd) : fsync(fd)) < 0 ? -errno : 0;
}

/* Size st (of the open file fd, or of path) as this node sees it: its dirty bytes included. */
static void adjust_size(struct stat *st, int fd, const char *path) {
    struct timespec born = birth(fd, path);
    pthread_mutex_lock(&lock);
    struct dirty *d = find(st, born, 0);
    if (d) {
        off_t end = dirty_end(d);
        if (end > st->st_size) st->st_size = end;
        st->st_blocks = (st->st_size + 511) / 512;
    }
    pthread_mutex_unlock(&lock);
}

/* Cut this node's dirty bytes of the open file fd to size. */
static void cut_open(int fd, off_t size) {
    struct stat st;
    if (fstat(fd, &st) < 0) return;
    struct timespec born = birth(fd, NULL);
    pthread_mutex_lock(&lock);
    struct dirty *d = find(&st, born, 0);
    if (d) cut(d, size);
    pthread_mutex_unlock(&lock);
}

static void *nc_init(struct fuse_conn_info *conn, struct fuse_config *cfg) {
    (void)conn;
    cfg->use_ino = 1;
    cfg->direct_io = 1; /* no kernel page cache: this process is the node's cache */
    cfg->entry_timeout = 0;
    cfg->attr_timeout = 0;
    cfg->negative_timeout = 0;
    cfg->hard_remove = 1;
    return NULL;
}

static int nc_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
    const char *where = rel(path);
    int res = fi ? fstat((int)fi->fh, st) : fstatat(backing, where, st, AT_SYMLINK_NOFOLLOW);
    if (res < 0) return -errno;
    if (!fi && S_ISDIR(st->st_mode)) remember(path + 1, st->st_ino);
    if (S_ISREG(st->st_mode)) adjust_size(st, fi ? (int)fi->fh : -1, path);
    return 0;
}

static int nc_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t offset, struct fuse_file_info *fi,
                      enum fuse_readdir_flags flags) {
    (void)offset, (void)fi, (void)flags;
    int fd = openat(backing, rel(path), O_RDONLY | O_DIRECTORY);
    if (fd < 0) return -errno;
    DIR *dir = fdopendir(fd);
    if (!dir) {
        close(fd);
        return -errno;
    }
    struct dirent *entry;
    while ((entry = readdir(dir))) fill(buf, entry->d_name, NULL, 0, 0);
    closedir(dir);
    return 0;
}

static int nc_open(const char *path, struct fuse_file_info *fi) {
    /* Read-write where allowed: an fsync through any descriptor writes the node's dirty bytes. */
    int flags = (fi->flags & ~(O_APPEND | O_DIRECT | O_ACCMODE)) | O_RDWR;
    int fd = openat(backing, rel(path), flags & ~O_TRUNC);
    if (fd < 0) {
        fd = openat(backing, rel(path), fi->flags & ~O_TRUNC);
        if (fd < 0) return -errno;
    }
    if ((fi->flags & O_TRUNC) && ftruncate(fd, 0) < 0) {
        int error = errno;
        close(fd);
        return -error;
    }
    if (fi->flags & O_TRUNC) cut_open(fd, 0);
    fi->fh = (uint64_t)fd;
    fi->direct_io = 1;
    return 0;
}

static int nc_create(const char *path, mode_t mode, struct fuse_file_info *fi) {
    int flags = fi->flags & ~(O_APPEND | O_DIRECT);
    if ((flags & O_ACCMODE) == O_WRONLY) flags = (flags & ~O_ACCMODE) | O_RDWR;
    int fd = openat(backing, rel(path), flags | O_CREAT, mode);
    if (fd < 0) return -errno;
    fi->fh = (uint64_t)fd;
    fi->direct_io = 1;
    return 0;
}

static int nc_read(const char *path, char *buf, size_t size, off_t offset, struct fuse_file_info *fi) {
    (void)path;
    int fd = (int)fi->fh;
    struct stat st;
    if (fstat(fd, &st) < 0) return -errno;
    adjust_size(&st, fd, NULL);
    if (offset >= st.st_size) return 0;
    if (offset + (off_t)size > st.st_size) size = (size_t)(st.st_size - offset);
    size_t got = 0;
    while (got < size) { /* backing bytes, zeros past its end */
        ssize_t done = pread(fd, buf + got, size - got, offset + (off_t)got);
        if (done < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (done == 0) break;
        got += (size_t)done;
    }
    memset(buf + got, 0, size - got);
    struct timespec born = birth(fd, NULL);
    pthread_mutex_lock(&lock);
    struct dirty *d = find(&st, born, 0);
    if (d) {
        for (struct extent *e = d->extents; e; e = e->next) {
            off_t lo = e->start > offset ? e->start : offset;
            off_t e_end = e->start + (off_t)e->length, hi = offset + (off_t)size;
            if (e_end < hi) hi = e_end;
            if (lo < hi) memcpy(buf + (lo - offset), e->bytes + (lo - e->start), (size_t)(hi - lo));
        }
    }
    pthread_mutex_unlock(&lock);
    return (int)size;
}

static int nc_write(const char *path, const char *buf, size_t size, off_t offset, struct fuse_file_info *fi) {
    (void)path;
    if (failing()) return -EIO;
    struct stat st;
    if (fstat((int)fi->fh, &st) < 0) return -errno;
    struct timespec born = birth((int)fi->fh, NULL);
    pthread_mutex_lock(&lock);
    int res = add(find(&st, born, 1), buf, size, offset);
    pthread_mutex_unlock(&lock);
    return res ? res : (int)size;
}

static int nc_truncate(const char *path, off_t size, struct fuse_file_info *fi) {
    int fd = fi ? (int)fi->fh : openat(backing, rel(path), O_WRONLY);
    if (fd < 0) return -errno;
    int res = ftruncate(fd, size) < 0 ? -errno : 0;
    if (res == 0) cut_open(fd, size);
    if (!fi) close(fd);
    return res;
}

static int nc_fsync(const char *path, int datasync, struct fuse_file_info *fi) {
    (void)path;
    return sync_file((int)fi->fh, datasync);
}

static int nc_fsyncdir(const char *path, int datasync, struct fuse_file_info *fi) {
    (void)datasync, (void)fi;
    int fd = openat(backing, rel(path), O_RDONLY | O_DIRECTORY);
    if (fd < 0) return -errno;
    int res = fsync(fd);
    close(fd);
    return res < 0 ? -errno : 0;
}

static int nc_release(const char *path, struct fuse_file_info *fi) {
    (void)path;
    close((int)fi->fh);
    return 0;
}

/* The file path names is about to lose that name: if it was its last link, forget its
 * dirty bytes (st and born were read before the unlink or rename). */
static void forget(const struct stat *st, struct timespec born) {
    if (!S_ISREG(st->st_mode) || st->st_nlink > 1) return;
    pthread_mutex_lock(&lock);
    struct dirty *d = find(st, born, 0);
    if (d) drop(d);
    pthread_mutex_unlock(&lock);
}

static int nc_unlink(const char *path) {
    struct stat st;
    int known = fstatat(backing, rel(path), &st, AT_SYMLINK_NOFOLLOW) == 0;
    struct timespec born = birth(-1, path);
    if (unlinkat(backing, rel(path), 0) < 0) return -errno;
    if (known) forget(&st, born);
    return 0;
}

static int nc_mkdir(const char *path, mode_t mode) {
    if (mkdirat(backing, rel(path), mode) < 0) return -errno;
    moved(path + 1, NULL);
    return 0;
}
static int nc_rmdir(const char *path) {
    if (unlinkat(backing, rel(path), AT_REMOVEDIR) < 0) return -errno;
    moved(path + 1, NULL);
    return 0;
}

static int nc_rename(const char *from, const char *to, unsigned int flags) {
    struct stat st;
    int replaced = (flags & RENAME_EXCHANGE) == 0 && fstatat(backing, rel(to), &st, AT_SYMLINK_NOFOLLOW) == 0;
    struct timespec born = birth(-1, to);
    if (renameat2(backing, rel(from), backing, rel(to), flags) < 0) return -errno;
    if (replaced) forget(&st, born);
    if (flags & RENAME_EXCHANGE) { /* both names now lead elsewhere: forget both */
        moved(from + 1, NULL);
        moved(to + 1, NULL);
    } else moved(from + 1, to + 1);
    return 0;
}

static int nc_link(const char *from, const char *to) {
    return linkat(backing, rel(from), backing, rel(to), 0) < 0 ? -errno : 0;
}
static int nc_symlink(const char *target, const char *path) {
    return symlinkat(target, backing, rel(path)) < 0 ? -errno : 0;
}
static int nc_readlink(const char *path, char *buf, size_t size) {
    ssize_t n = readlinkat(backing, rel(path), buf, size - 1);
    if (n < 0) return -errno;
    buf[n] = 0;
    return 0;
}
static int nc_chmod(const char *path, mode_t mode, struct fuse_file_info *fi) {
    int res = fi ? fchmod((int)fi->fh, mode) : fchmodat(backing, rel(path), mode, 0);
    return res < 0 ? -errno : 0;
}
static int nc_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi) {
    int res = fi ? fchown((int)fi->fh, uid, gid) : fchownat(backing, rel(path), uid, gid, AT_SYMLINK_NOFOLLOW);
    return res < 0 ? -errno : 0;
}
static int nc_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi) {
    int res = fi ? futimens((int)fi->fh, tv) : utimensat(backing, rel(path), tv, AT_SYMLINK_NOFOLLOW);
    return res < 0 ? -errno : 0;
}
static int nc_statfs(const char *path, struct statvfs *st) {
    (void)path;
    return fstatvfs(backing, st) < 0 ? -errno : 0;
}
static int nc_access(const char *path, int mask) {
    return faccessat(backing, rel(path), mask, AT_EACCESS) < 0 ? -errno : 0;
}
static int nc_fallocate(const char *path, int mode, off_t offset, off_t length, struct fuse_file_info *fi) {
    (void)path;
    if (mode) return -EOPNOTSUPP;
    return -posix_fallocate((int)fi->fh, offset, length); /* 0, or the error (ENOSPC) */
}

static const struct fuse_operations operations = {
    .init = nc_init,
    .getattr = nc_getattr,
    .readdir = nc_readdir,
    .open = nc_open,
    .create = nc_create,
    .read = nc_read,
    .write = nc_write,
    .truncate = nc_truncate,
    .fsync = nc_fsync,
    .fsyncdir = nc_fsyncdir,
    .release = nc_release,
    .unlink = nc_unlink,
    .mkdir = nc_mkdir,
    .rmdir = nc_rmdir,
    .rename = nc_rename,
    .link = nc_link,
    .symlink = nc_symlink,
    .readlink = nc_readlink,
    .chmod = nc_chmod,
    .chown = nc_chown,
    .utimens = nc_utimens,
    .statfs = nc_statfs,
    .access = nc_access,
    .fallocate = nc_fallocate,
};

int main(int argc, char *argv[]) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s BACKING MOUNTPOINT [fuse options]\n", argv[0]);
        return 2;
    }
    const char *ttl = getenv("NODECACHE_DENTRY_TTL");
    if (ttl && *ttl) dentry_ttl = atof(ttl);
    fail_writes = getenv("NODECACHE_FAIL_WRITES");
    if (fail_writes && !*fail_writes) fail_writes = NULL;
    backing = open(argv[1], O_RDONLY | O_DIRECTORY);
    if (backing < 0) {
        perror(argv[1]);
        return 1;
    }
    umask(0);
    argv[1] = argv[0];
    return fuse_main(argc - 1, argv + 1, &operations, NULL);
}
