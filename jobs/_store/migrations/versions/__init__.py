"""jobs/_store/migrations/versions"""
